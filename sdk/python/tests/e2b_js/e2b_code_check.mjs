// E2B's code interpreter JS SDK (@e2b/code-interpreter@2.8.0, package-lock.json),
// unmodified, against forkvm's E2B face and the code-interpreter template's server.
// Run by test_e2b_sdk.py with E2B_API_KEY, E2B_API_URL and E2B_SANDBOX_URL pointing at a
// daemon on loopback; exits non-zero, naming the step, on the first failure.
import assert from 'node:assert/strict'
import { Sandbox } from '@e2b/code-interpreter'

const step = (name) => console.log(`step: ${name}`)

step('create')
const sbx = await Sandbox.create({ timeoutMs: 600_000 })
try {
  step('state carries over between runs')
  const first = await sbx.runCode('y = 20')
  assert.equal(first.error, undefined)
  const second = await sbx.runCode('y + 22')
  assert.equal(second.text, '42')

  step('an exception is an ExecutionError')
  const failed = await sbx.runCode("raise ValueError('bad value')")
  assert.equal(failed.error.name, 'ValueError')
  assert.equal(failed.error.value, 'bad value')
  assert.match(failed.error.traceback, /Traceback/)

  step('a plot comes back as a PNG')
  const plot = await sbx.runCode('import matplotlib.pyplot as plt\nplt.plot([3, 1, 2])\nplt.show()')
  const png = plot.results.find((r) => r.png)?.png
  assert.ok(png && Buffer.from(png, 'base64').subarray(0, 4).equals(Buffer.from([0x89, 0x50, 0x4e, 0x47])))

  step('stdout streams to the callback')
  const lines = []
  await sbx.runCode("print('from js')", { onStdout: (m) => lines.push(m.line) })
  assert.deepEqual(lines, ['from js\n'])
} finally {
  step('kill')
  await sbx.kill()
}
console.log('ok')
