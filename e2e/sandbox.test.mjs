// End-to-end sandbox over stdio with the official MCP SDK: create_session
// gets the policy's default sandbox (the e2e policy has no sandbox block:
// net none, an unprivileged user of the session's own, writes only in its
// own directories) and says what the guest enforces; a command runs in it
// as that user; a write to /root comes back to the agent as the shell's
// "Permission denied" with a note on the sandbox, and the guest has no such
// file afterwards; a looser ask and a forged session marker are refused.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { env, missingEnv, TAGS, call, ok, text, assertTag, connectStdio } from './lib.mjs';

test('a sandboxed session through the MCP SDK', { skip: missingEnv }, async (t) => {
  const client = await connectStdio('local', 'vmgate-e2e-sandbox');
  t.after(() => client.close());
  const escape = `/root/vmgate-e2e-escape-${process.pid}`;

  const created = await ok(client, 'create_session', { vm: env.vm, ttl_s: 900 });
  const sess = created.structuredContent;
  const e = sess.enforced;
  await t.test('create_session says what the guest enforces', () => {
    assert.equal(e.sandboxed, true, `enforced ${JSON.stringify(e)}`);
    assert.equal(e.user, 'session');
    assert.ok(e.uid >= 1_000_000 && e.gid >= 1_000_000, `uid ${e.uid} gid ${e.gid}; want the session's own, from the sandbox range`);
    assert.equal(e.no_new_privs, true);
    assert.equal(e.capabilities, 'none');
    assert.equal(e.landlock.fs, true, 'Landlock filesystem rules');
    assert.ok(e.landlock.abi >= 1, `Landlock ABI ${e.landlock.abi}`);
    assert.ok(e.landlock.rights.includes('write_file'), `rights ${e.landlock.rights}`);
    assert.deepEqual(e.landlock.write.slice(0, 1), [sess.workdir], 'the workdir is the first write path');
    assert.equal(e.net.mode, 'none');
    assert.equal(e.net.namespace, true);
    assert.equal(e.cgroup.path, `/vmgate/${sess.session}`);
    assert.equal(e.membership, 'cgroup');
    assert.equal(sess.sandbox.net, 'none');
    assert.match(text(created), new RegExp(`confined: user session \\(uid ${e.uid}, gid ${e.gid}\\)`));
  });

  await t.test('a command runs in it, as the session user, in its workdir', async () => {
    const res = await ok(client, 'vm_agent_exec', {
      vm: env.vm, session: sess.session, shell: 'id -u; pwd; echo made > made.txt && cat made.txt | tr a-z A-Z',
    });
    assert.equal(res.structuredContent.exit_code, 0, text(res));
    assert.equal(res.structuredContent.stdout, `${e.uid}\n${sess.workdir}\nMADE\n`);
  });

  await t.test('a write to /root comes back as a clear error', async () => {
    const res = await call(client, 'vm_agent_exec', { vm: env.vm, session: sess.session, shell: `echo pwned > ${escape}` });
    assert.notEqual(res.structuredContent.exit_code, 0, `exit code of the denied write: ${text(res)}`);
    assert.match(res.structuredContent.stderr, /Permission denied/, 'the shell says why');
    assert.match(text(res), /Permission denied/);
    assert.match(text(res), /sessions are sandboxed: a command may write only in the session's workdir/);
    assert.ok(res.structuredContent.sandbox_note, 'sandbox_note');
    // Checked from outside the session: nothing was written.
    const check = await ok(client, 'vm_agent_exec', { vm: env.vm, command: ['/bin/sh', '-c', `test ! -e ${escape} && echo absent`] });
    assert.equal(check.structuredContent.stdout, 'absent\n', `${escape} must not exist`);
  });

  await t.test('list_sessions reports the same enforcement', async () => {
    const res = await ok(client, 'list_sessions', { vm: env.vm });
    const mine = res.structuredContent.sessions.find((s) => s.session === sess.session);
    assert.ok(mine, `list_sessions = ${text(res)}; want ${sess.session}`);
    assert.equal(mine.enforced.uid, e.uid);
    assert.equal(mine.enforced.landlock.abi, e.landlock.abi);
    assert.deepEqual(mine.enforced.cgroup.controllers, e.cgroup.controllers);
    assert.equal(mine.in_guest, true);
  });

  await t.test('a looser sandbox is denied, naming what was too loose', async () => {
    const res = await call(client, 'create_session', { vm: env.vm, sandbox: { net: 'host' } });
    assertTag(res, TAGS.denied, 'create_session with net host');
    assert.match(text(res), /net "host" is looser than the policy's "none"/);
    const bad = await call(client, 'create_session', { vm: env.vm, sandbox: { fs: { write: ['/srv/../root'] } } });
    assertTag(bad, TAGS.invalid, 'create_session with a path that is not clean');
    assert.match(text(bad), /sandbox\.fs\.write\[0\]/);
  });

  await t.test('a VMGATE_* variable in env is refused on every exec road', async () => {
    for (const args of [
      { vm: env.vm, command: ['env'], env: { VMGATE_SESSION: `${sess.session}.forged` } },
      { vm: env.vm, command: ['env'], env: { vmgate_session: 'x' }, session: sess.session },
    ]) {
      const res = await call(client, 'vm_agent_exec', args);
      assertTag(res, TAGS.invalid, `vm_agent_exec(${JSON.stringify(args)})`);
      assert.match(text(res), /VMGATE_\* variables are reserved/);
    }
  });
});
