// Drives envd's process service through E2B's own SDK (commands and pty),
// against the envd at $ENVD_URL, and prints what it saw as JSON.
import { Sandbox } from 'e2b'

const sbx = new Sandbox({
  sandboxId: 'sdk-test', sandboxUrl: process.env.ENVD_URL, envdAccessToken: process.env.ENVD_TOKEN,
  envdVersion: '0.5.7', apiKey: 'unused',
})
const out = {}
const step = async (name, fn) => {
  try { out[name] = await fn() } catch (e) { out[name] = { error: e.name, exitCode: e.exitCode, message: e.message } }
}
await step('run', async () => {
  const r = await sbx.commands.run('echo hello; echo err >&2')
  return { stdout: r.stdout, stderr: r.stderr, exitCode: r.exitCode }
})
await step('exit', () => sbx.commands.run('exit 3'))
await step('envCwd', async () => (await sbx.commands.run('echo "$FOO $(pwd)"', { envs: { FOO: 'bar' }, cwd: '/tmp' })).stdout)
await step('background', async () => {
  // Its output starts after the disconnect: what the start's stream read
  // is not kept, only what was written while nobody was connected.
  const bg = await sbx.commands.run('sleep 1; for i in 1 2 3 4 5 6 7 8; do echo $i; sleep 0.2; done', { background: true })
  await bg.disconnect()
  const listed = (await sbx.commands.list()).some((p) => p.pid === bg.pid)
  await new Promise((r) => setTimeout(r, 500))
  let seen = ''
  const h = await sbx.commands.connect(bg.pid, { onStdout: (d) => { seen += d } })
  const r = await h.wait()
  return { listed, seen, exitCode: r.exitCode }
})
await step('stdin', async () => {
  const cat = await sbx.commands.run('cat', { background: true, stdin: true })
  await sbx.commands.sendStdin(cat.pid, 'to-cat\n')
  await sbx.commands.closeStdin(cat.pid)
  return (await cat.wait()).stdout
})
await step('killUnknown', () => sbx.commands.kill(999999))
await step('kill', async () => {
  const s = await sbx.commands.run('sleep 100', { background: true })
  const killed = await sbx.commands.kill(s.pid)
  try { await s.wait(); return { killed } } catch (e) { return { killed, error: e.name, exitCode: e.exitCode, message: e.error } }
})
await step('pty', async () => {
  let data = ''
  const t = await sbx.pty.create({ cols: 80, rows: 24, onData: (d) => { data += new TextDecoder().decode(d) } })
  await sbx.pty.resize(t.pid, { cols: 100, rows: 30 })
  await sbx.pty.sendInput(t.pid, new TextEncoder().encode('stty size; exit 0\n'))
  await t.wait()
  return data.includes('30 100')
})
await step('ghost', () => sbx.commands.run('true', { user: 'ghost' }))
console.log(JSON.stringify(out))
