# forkvm warm-interpreter driver, embedded in forkvm-agent and run with `python3 -c`.
# Requests arrive on the fd named first in FORKVM_EVAL_FDS, results leave on the second,
# each as a 4-byte big-endian length + payload (UTF-8 code in, JSON out). stdin/stdout
# stay free for user code; its prints during an eval are captured and returned.
import ast, contextlib, io, json, os, struct, sys, traceback

_rfd, _wfd = (int(x) for x in os.environ.pop("FORKVM_EVAL_FDS").split(","))
_globals = {"__name__": "__main__", "__builtins__": __builtins__}


def _read_exact(n):
    buf = b""
    while len(buf) < n:
        chunk = os.read(_rfd, n - len(buf))
        if not chunk:
            sys.exit(0)
        buf += chunk
    return buf


def _send(obj):
    data = json.dumps(obj).encode()
    data = struct.pack(">I", len(data)) + data
    while data:
        data = data[os.write(_wfd, data):]


def _run(code):
    tree = ast.parse(code, "<eval>", "exec")
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = ast.Expression(tree.body.pop().value)
    exec(compile(tree, "<eval>", "exec"), _globals)
    if last is None:
        return None
    return repr(eval(compile(last, "<eval>", "eval"), _globals))


while True:
    (_n,) = struct.unpack(">I", _read_exact(4))
    _code = _read_exact(_n).decode("utf-8", "replace")
    _out, _err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(_out), contextlib.redirect_stderr(_err):
            _res = {"ok": True, "value_repr": _run(_code)}
    except BaseException as e:  # SystemExit and KeyboardInterrupt must not kill the driver
        tb = traceback.format_exception(type(e), e, e.__traceback__.tb_next)
        exc = "".join(traceback.format_exception_only(type(e), e)).strip()
        _res = {"ok": False, "exception": exc, "traceback": "".join(tb)}
    _res["stdout"] = _out.getvalue()
    _res["stderr"] = _err.getvalue()
    _send(_res)
