// E2B's JS SDK (e2b@2.51.0, package-lock.json), unmodified, against forkvm's E2B face.
// Run by test_e2b_sdk.py with E2B_API_KEY, E2B_API_URL and E2B_SANDBOX_URL pointing at
// a daemon on loopback; exits non-zero, naming the step, on the first failure.
import assert from 'node:assert/strict'
import { Sandbox, CommandExitError } from 'e2b'

const step = (name) => console.log(`step: ${name}`)

step('create')
const sbx = await Sandbox.create('base', { timeoutMs: 120_000, metadata: { lang: 'js' } })
try {
  step('commands.run')
  const r = await sbx.commands.run('echo hi; whoami')
  assert.equal(r.stdout, 'hi\nuser\n')
  assert.equal(r.exitCode, 0)

  step('a failing command throws CommandExitError')
  await assert.rejects(sbx.commands.run('echo bad >&2; exit 4'), (e) => {
    assert.ok(e instanceof CommandExitError, `${e}`)
    assert.equal(e.exitCode, 4)
    assert.equal(e.stderr, 'bad\n')
    return true
  })

  step('files')
  await sbx.files.write('js/hello.txt', 'from node')
  assert.equal(await sbx.files.read('js/hello.txt'), 'from node')
  const entries = await sbx.files.list('js')
  assert.deepEqual(
    entries.map((e) => [e.name, e.path, e.owner, e.group]),
    [['hello.txt', '/home/user/js/hello.txt', 'user', 'user']]
  )

  step('files.watchDir')
  await sbx.files.makeDir('jsw')
  const seen = []
  const watch = await sbx.files.watchDir('jsw', (e) => seen.push([e.type, e.name]))
  await sbx.commands.run('cd jsw && : > x && echo y >> x && rm x')
  for (let i = 0; i < 300 && seen.length < 3; i++) await new Promise((r) => setTimeout(r, 200))
  await watch.stop()
  assert.deepEqual(seen, [['create', 'x'], ['write', 'x'], ['remove', 'x']])

  step('background command and kill')
  const h = await sbx.commands.run('sleep 120', { background: true })
  assert.ok(h.pid > 1)
  assert.equal(await h.kill(), true)
  await assert.rejects(h.wait(), (e) => e instanceof CommandExitError)

  step('info and list')
  const info = await sbx.getInfo()
  assert.equal(info.sandboxId, sbx.sandboxId)
  assert.equal(info.state, 'running')
  const listed = await Sandbox.list({ query: { metadata: { lang: 'js' } } }).nextItems()
  assert.deepEqual(listed.map((s) => s.sandboxId), [sbx.sandboxId])

  step('pause and connect')
  await sbx.files.write('kept.txt', 'kept')
  assert.equal(await sbx.pause(), true)
  assert.equal(await sbx.isRunning(), false)
  const again = await Sandbox.connect(sbx.sandboxId)
  assert.equal(await again.files.read('kept.txt'), 'kept')
} finally {
  step('kill')
  assert.equal(await Sandbox.kill(sbx.sandboxId), true)
}
assert.equal(await sbx.isRunning(), false)
console.log('ok')
