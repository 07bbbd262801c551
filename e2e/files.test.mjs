// Paths that mean files (issue 15): vm_file_read and vm_file_write with the
// official MCP SDK over stdio, against symlinks out of the directory the
// policy allows (planted by files_test.go, which checks the guest after).
// Grant "files" follows no symlink; grant "follow" lets reads follow them,
// and the policy decides again on the real path.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js';
import { env, missingEnv, TAGS, call, ok, text, assertTag } from './lib.mjs';

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
