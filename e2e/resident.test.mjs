// The resident helper (issue 30) through the official MCP SDK over stdio:
// live output of a sandboxed session's command, a command that runs past
// the server's timeout cap and a restart of the server, the helper killed
// from the host side, and what a session's processes cannot do to it.
// resident_test.go writes the config (the server's cap 4 s, the grant's
// policy 60 s) and boots the lab VM with the helper's port.
import { test } from 'node:test';
import { setTimeout as pause } from 'node:timers/promises';
import assert from 'node:assert/strict';
import { env, missingEnv, TAGS, call, ok, text, assertTag, connectStdio, scaled } from './lib.mjs';

const GUEST = '/usr/local/bin/vmgate-guest';

// until polls fn (an async function returning a value or undefined) every
// 50 ms until it returns a value, up to limitMs (scaled by the machine's
// load); the polls are the condition waited for.
async function until(what, limitMs, fn) {
  const limit = scaled(limitMs);
  const end = Date.now() + limit;
  for (;;) {
    const v = await fn();
    if (v !== undefined) return v;
    if (Date.now() > end) assert.fail(`${what}: not within ${limit} ms`);
    await pause(50);
  }
}

// status reads the job from cursor since.
async function status(client, id, since) {
  const args = { vm: env.vm, exec_id: id };
  if (since) args.since = since;
  const res = await ok(client, 'vm_agent_exec_status', args);
  return res.structuredContent;
}

// helperPID is the resident helper's pid as vm_status says it.
async function helperPID(client) {
  const st = (await ok(client, 'vm_status', { vm: env.vm })).structuredContent;
  return st.helper?.pid;
}

// outside runs a plain command (root, through the guest agent).
async function outside(client, shell) {
  const res = await ok(client, 'vm_agent_exec', { vm: env.vm, command: ['/bin/sh', '-c', shell] });
  return res.structuredContent;
}

test('the resident helper through the MCP SDK', { skip: missingEnv }, async (t) => {
  let client = await connectStdio('resident', 'vmgate-e2e-resident');
  t.after(() => client.close());
  const sess = (await ok(client, 'create_session', { vm: env.vm, ttl_s: 900 })).structuredContent;
  assert.equal(sess.enforced.sandboxed, true, 'the session is sandboxed');

  let execID;
  let seen = '';
  await t.test('a command in the session streams its output while it runs', async () => {
    const started = await ok(client, 'vm_agent_exec', {
      vm: env.vm, session: sess.session, wait: false, timeout_s: 40,
      shell: 'i=1; while [ $i -le 12 ]; do echo line $i; i=$((i+1)); sleep 1; done',
    });
    execID = started.structuredContent.exec_id;
    assert.equal(started.structuredContent.job, true, text(started));
    let since;
    const first = await until('the first line while it runs', 30_000, async () => {
      const st = await status(client, execID, since);
      since = st.next;
      seen += st.stdout ?? '';
      return seen.includes('line 1\n') ? st : undefined;
    });
    assert.equal(first.exited, false, `running when line 1 was read: ${JSON.stringify(first)}`);
    assert.equal(first.state, 'running');
    // Only what came after the cursor, never what was read already.
    const more = await until('more lines', 30_000, async () => {
      const st = await status(client, execID, since);
      return st.stdout ? st : undefined;
    });
    assert.ok(!more.stdout.includes('line 1\n'), `since ${JSON.stringify(since)} gave ${JSON.stringify(more.stdout)} again`);
    assert.equal(more.stdout_offset, since.stdout);
  });

  await t.test('a restarted server finds the command, still running past the server\'s cap', async () => {
    await client.close();
    client = await connectStdio('resident', 'vmgate-e2e-resident-2');
    const st = await status(client, execID);
    assert.equal(st.exited, false, `after the restart: ${JSON.stringify(st)}`);
    const end = await until('the command\'s end', 60_000, async () => {
      const s = await status(client, execID);
      return s.exited ? s : undefined;
    });
    assert.equal(end.exit_code, 0, JSON.stringify(end));
    assert.equal(end.timed_out, false, 'it ran 12 s, past the server\'s 4 s cap, within the policy\'s');
    assert.match(end.stdout, /^line 1\n[^]*line 12\n$/);
    const over = await call(client, 'vm_agent_exec', { vm: env.vm, command: ['true'], timeout_s: 61 });
    assertTag(over, TAGS.denied, 'timeout_s over the policy\'s cap');
  });

  await t.test('the helper killed from the host side comes back, with the session', async () => {
    const old = await helperPID(client);
    assert.ok(old > 1, `helper pid ${old}`);
    await outside(client, `kill -9 ${old}`);
    const list = await ok(client, 'list_sessions', { vm: env.vm });
    assert.ok(list.structuredContent.sessions.some((s) => s.session === sess.session && s.in_guest), JSON.stringify(list.structuredContent));
    const res = await ok(client, 'vm_agent_exec', { vm: env.vm, session: sess.session, command: ['id', '-u'] });
    assert.equal(res.structuredContent.stdout, `${sess.enforced.uid}\n`);
    const now = await helperPID(client);
    assert.ok(now > 1 && now !== old, `helper pid after the kill ${now}; want a new one, not ${old}`);
  });

  await t.test('a session process cannot open, signal or replace the helper', async () => {
    const pid = await helperPID(client);
    const sum = (await outside(client, `sha256sum ${GUEST}`)).stdout;
    for (const attempt of [
      'cat /dev/virtio-ports/org.vmgate.guest.0',
      'ls /var/lib/vmgate/helper/',
      `kill -TERM ${pid}`,
      `kill -STOP ${pid}`,
      `cp /bin/true ${GUEST}`,
      `rm -f ${GUEST}`,
    ]) {
      const res = await call(client, 'vm_agent_exec', { vm: env.vm, session: sess.session, shell: attempt });
      assert.equal(res.isError ?? false, false, `${attempt} in the session did not run: ${text(res)}`);
      assert.notEqual(res.structuredContent.exit_code, 0, `${attempt} in the session exited 0: ${text(res)}`);
    }
    // From outside: the same helper runs, not stopped, from the same binary.
    const st = await outside(client, `grep '^State:' /proc/${pid}/status; sha256sum ${GUEST}`);
    assert.match(st.stdout, /^State:\s+[SR]/, `the helper's state: ${st.stdout}`);
    assert.ok(st.stdout.endsWith(sum), `the helper's binary: ${st.stdout}; want ${sum}`);
    assert.equal(await helperPID(client), pid, 'the same helper answers');
  });

  await ok(client, 'destroy_session', { vm: env.vm, session: sess.session });
});
