"""One run of the forkd-compat calls that cost something new (issue 24): a full branch with
and without measure_diff, and workspace create, suspend, resume, through forkd's listener
(`forkvm daemon --forkd-compat`, 127.0.0.1:8889). Prints one JSON object. Run from the repo:
FORKVM_BIN=$PWD/target/debug/forkvm python3 bench/2026-12-05-forkd-compat-measure.py"""
import json, sys, time, statistics
from pathlib import Path
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "sdk/python/tests")); sys.path.insert(0, str(REPO / "sdk/python"))
from daemon_proc import start_daemon
import urllib.request
TOKEN = "forkd-measure-token-0123456789abcdef"
def call(method, path, body=None):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request("http://127.0.0.1:8889" + path, data=data, method=method)
    req.add_header("Authorization", f"Bearer {TOKEN}")
    if data is not None: req.add_header("Content-Type", "application/json")
    t = time.perf_counter()
    with urllib.request.urlopen(req, timeout=900) as r:
        text = r.read()
    return (time.perf_counter() - t) * 1e3, (json.loads(text) if text else None)
d = start_daemon(["--forkd-compat"], files={"token": TOKEN}, env_extra={"FORKD_TOKEN_FILE": "{root}/token"})
out = {}
try:
    call("POST", "/v1/snapshots", {"tag": "py", "template": "python"})
    ms, sbs = call("POST", "/v1/sandboxes", {"snapshot_tag": "py", "n": 1, "per_child_netns": True, "live_fork": True})
    sid = sbs[0]["id"]; out["spawn_ms"] = round(ms, 1)
    full, measured = [], []
    for i in range(5):
        ms, s = call("POST", f"/v1/sandboxes/{sid}/branch", {"tag": f"f{i}"}); full.append((ms, s["pause_us"]))
        ms, s = call("POST", f"/v1/sandboxes/{sid}/branch", {"tag": f"m{i}", "measure_diff": True})
        measured.append((ms, s["pause_us"], s["diff_ms"], s["diff_physical_bytes"], s["diff_logical_bytes"]))
    med = lambda xs: round(statistics.median(xs), 1)
    out["full_branch_call_ms_median"] = med([f[0] for f in full]); out["full_branch_pause_us_median"] = med([f[1] for f in full])
    out["measure_diff_branch_call_ms_median"] = med([m[0] for m in measured]); out["measure_diff_pause_us_median"] = med([m[1] for m in measured])
    out["diff_ms_median"] = med([m[2] for m in measured]); out["diff_physical_bytes"] = [m[3] for m in measured]; out["diff_logical_bytes"] = measured[0][4]
    ms, w = call("POST", "/v1/workspaces", {"name": "dev", "snapshot_tag": "py", "per_child_netns": False}); out["ws_create_ms"] = round(ms, 1)
    sus, res = [], []
    for i in range(3):
        ms, _ = call("POST", "/v1/workspaces/dev/suspend", {"diff": False}); sus.append(ms)
        ms, _ = call("POST", "/v1/workspaces/dev/resume", {}); res.append(ms)
    out["ws_suspend_ms"] = [round(x) for x in sus]; out["ws_resume_ms"] = [round(x) for x in res]
    call("DELETE", "/v1/workspaces/dev")
finally:
    d.stop()
print(json.dumps(out))
