// Directories in and out (issue 33): vm_archive_write moves a tar into the
// lab VM, vm_dir_list and vm_archive_read bring it back, with the official
// MCP SDK over stdio. archive_test.go makes the tar, plants a file the
// policy refuses, and compares what came back byte for byte.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync, writeFileSync } from 'node:fs';
import { env, missingEnv, TAGS, call, ok, text, assertTag, connectStdio } from './lib.mjs';

const D = '/tmp/vmgate-e2e-arch/in';
const tarIn = process.env.VMGATE_E2E_TAR_IN;
const tarOut = process.env.VMGATE_E2E_TAR_OUT;

test('a directory moves into the VM and back out', { skip: missingEnv || !tarIn || !tarOut }, async (t) => {
  const client = await connectStdio('arch', 'vmgate-e2e-archive');
  try {
    const tar = readFileSync(tarIn).toString('base64');
    await t.test('vm_archive_write writes the tree, refusing ../ and the policy\'s paths entry by entry', async () => {
      const res = await ok(client, 'vm_archive_write', { vm: env.vm, path: D, content_base64: tar });
      const sc = res.structuredContent;
      assert.equal(sc.policy_refused, 1, 'secret.txt refused by the policy');
      const refused = (sc.refused_entries ?? []).map((e) => e.name).sort();
      assert.deepEqual(refused, ['../vmgate-e2e-escape', 'secret.txt']);
      assert.ok(sc.written >= 5, `written ${sc.written}`);
    });
    await t.test('the tool is destructive, the readers read-only', async () => {
      const { tools } = await client.listTools();
      const by = Object.fromEntries(tools.map((x) => [x.name, x.annotations]));
      assert.equal(by.vm_archive_write.destructiveHint, true);
      assert.equal(by.vm_archive_read.readOnlyHint, true);
      assert.equal(by.vm_dir_list.readOnlyHint, true);
    });
    await t.test('vm_dir_list shows the tree, not what the policy hides', async () => {
      const res = await ok(client, 'vm_dir_list', { vm: env.vm, path: D, depth: 3 });
      const paths = res.structuredContent.entries.map((e) => e.path);
      for (const p of ['a.txt', 'sub', 'sub/b.bin', 'sub/deep', 'sub/deep/c.txt']) assert.ok(paths.includes(p), `${p} in ${paths}`);
      assert.ok(!paths.some((p) => p.includes('secret')), `no secret in ${paths}`);
      assert.equal(res.structuredContent.hidden, 1, 'the planted secret');
    });
    await t.test('vm_archive_read brings it back, the secret cut out', async () => {
      const res = await ok(client, 'vm_archive_read', { vm: env.vm, path: D, gzip: true });
      const sc = res.structuredContent;
      assert.deepEqual(sc.policy_skipped, [`${D}/secret-planted`]);
      const data = Buffer.from(sc.content_base64, 'base64');
      assert.equal(data.length, sc.size);
      writeFileSync(tarOut, data);
    });
    await t.test('a directory outside the rule is refused', async () => {
      const res = await call(client, 'vm_archive_read', { vm: env.vm, path: '/etc' });
      assertTag(res, TAGS.denied, 'archive of /etc');
      assert.doesNotMatch(text(res), /root:/);
    });
  } finally {
    await client.close();
  }
});
