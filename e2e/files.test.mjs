// Paths that mean files (issue 15): vm_file_read and vm_file_write with the
// official MCP SDK over stdio, against symlinks out of the directory the
// policy allows (planted by files_test.go, which checks the guest after).
// Grant "files" follows no symlink; grant "follow" lets reads follow them,
// and the policy decides again on the real path.
import { test } from 'node:test';
import { createHash } from 'node:crypto';
import assert from 'node:assert/strict';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js';
import { env, missingEnv, TAGS, call, ok, text, assertTag, scaled } from './lib.mjs';

const D = '/tmp/vmgate-e2e-files';

async function connect(grant) {
  const transport = new StdioClientTransport({
    command: env.bin,
    args: ['serve', '--config', env.config, '--grant', grant],
    env: { ...process.env, VMGATE_LOG_LEVEL: 'warn' },
    stderr: 'inherit',
  });
  const client = new Client({ name: 'vmgate-e2e-files', version: '1.0.0' });
  await client.connect(transport);
  return client;
}

test('file paths resolve in the guest without following symlinks', { skip: missingEnv }, async (t) => {
  const client = await connect('files');
  try {
    await t.test('a symlink to a root-only file is refused, naming it', async () => {
      const res = await call(client, 'vm_file_read', { vm: env.vm, path: `${D}/link` });
      assertTag(res, TAGS.denied, 'read through a symlink');
      assert.match(text(res), /\/tmp\/vmgate-e2e-files\/link is a symlink/);
      assert.doesNotMatch(text(res), /root only/);
    });
    await t.test('a plain file inside the rule is read', async () => {
      const res = await ok(client, 'vm_file_read', { vm: env.vm, path: `${D}/plain` });
      assert.equal(res.structuredContent.content, 'plain');
      assert.equal(res.structuredContent.path, `${D}/plain`);
    });
    await t.test('.. is refused before the policy sees it', async () => {
      const res = await call(client, 'vm_file_read', { vm: env.vm, path: `${D}/../../root/vmgate-e2e-secret` });
      assertTag(res, TAGS.invalid, 'read with ..');
      assert.match(text(res), /not clean/);
    });
    await t.test('a write over a symlink to /etc/passwd is refused', async () => {
      const res = await call(client, 'vm_file_write', { vm: env.vm, path: `${D}/passwd`, content: 'root::0:0:root:/root:/bin/sh\n' });
      assertTag(res, TAGS.denied, 'write over a symlink');
      assert.match(text(res), /passwd is a symlink/);
    });
    await t.test('setuid is refused', async () => {
      const res = await call(client, 'vm_file_write', { vm: env.vm, path: `${D}/new-setuid`, content: '#!/bin/sh\n', mode: 0o4777 });
      assertTag(res, TAGS.denied, 'mode 04777');
      assert.match(text(res), /setuid/);
    });
    await t.test('a new file without a mode gets 0644', async () => {
      const res = await ok(client, 'vm_file_write', { vm: env.vm, path: `${D}/new-default`, content: 'made by e2e' });
      assert.equal(res.structuredContent.mode, 0o644); // the number mode takes
      assert.equal(res.structuredContent.mode_octal, '0644');
      assert.equal(res.structuredContent.created, true);
    });
    await t.test('an explicit mode is set exactly', async () => {
      const res = await ok(client, 'vm_file_write', { vm: env.vm, path: `${D}/new-0600`, content: 'x', mode: 0o600 });
      assert.equal(res.structuredContent.mode, 0o600);
      assert.equal(res.structuredContent.mode_octal, '0600');
    });
  } finally {
    await client.close();
  }
});

test('with follow_symlinks the policy decides on the real path', { skip: missingEnv }, async (t) => {
  const client = await connect('follow');
  try {
    await t.test('a link out of the rule is refused with where it leads', async () => {
      const res = await call(client, 'vm_file_read', { vm: env.vm, path: `${D}/link` });
      assertTag(res, TAGS.denied, 'followed link to /root');
      assert.match(text(res), /leads through symlinks to \/root\/vmgate-e2e-secret/);
      assert.doesNotMatch(text(res), /root only/);
    });
    await t.test('a link inside the rule is followed and reports the real path', async () => {
      const res = await ok(client, 'vm_file_read', { vm: env.vm, path: `${D}/inside` });
      assert.equal(res.structuredContent.content, 'plain');
      assert.equal(res.structuredContent.path, `${D}/plain`);
      assert.equal(res.structuredContent.requested_path, `${D}/inside`);
    });
  } finally {
    await client.close();
  }
});

// A 16 MiB range is more than one message carries (the SDK's stdio client
// drops its connection on a message over 10 MiB): the server answers with
// the part that fits, truncated, saying where to read on, with progress in
// bytes on the way; read on, the ranges reassemble the file, whose SHA-256
// the guest reports (hash, length 0).
test('a range larger than one message comes back in parts the SDK reads', { skip: missingEnv }, async () => {
  const client = await connect('files');
  try {
    const path = `${D}/big`;
    const whole = await ok(client, 'vm_file_read', { vm: env.vm, path, length: 0, hash: true });
    assert.equal(whole.structuredContent.size, 16 << 20);
    const h = createHash('sha256');
    let offset = 0;
    let first = true;
    for (;;) {
      const seen = [];
      const res = await client.callTool({ name: 'vm_file_read', arguments: { vm: env.vm, path, offset, length: 16 << 20 } }, undefined,
        { timeout: scaled(300_000), onprogress: (p) => seen.push(p) });
      assert.equal(res.isError ?? false, false, text(res));
      const sc = res.structuredContent;
      const data = Buffer.from(sc.content_base64, 'base64');
      assert.equal(data.length, sc.bytes);
      if (first) {
        assert.ok(sc.bytes < 8 << 20 && sc.truncated && !sc.eof, `first range: ${sc.bytes} bytes, truncated ${sc.truncated}; want under 8 MiB, truncated`);
        assert.match(text(res), new RegExp(`message limit\\); read on with offset ${sc.bytes}`));
        assert.ok(seen.some((p) => p.total > 0 && p.progress > 0 && p.progress <= p.total),
          `progress ${JSON.stringify(seen)}; want bytes moved, out of a total`);
        for (let i = 1; i < seen.length; i++) {
          assert.ok(seen[i].progress > seen[i - 1].progress, `progress ${JSON.stringify(seen)}; want increasing`);
        }
        first = false;
      }
      h.update(data);
      offset += sc.bytes;
      if (sc.eof) break;
    }
    assert.equal(offset, 16 << 20);
    assert.equal(h.digest('hex'), whole.structuredContent.sha256);
  } finally {
    await client.close();
  }
});
