import assert from 'node:assert/strict';
import { describe, it } from 'node:test';

import {
  apiUrl,
  credentialFormUrl,
  failureMessage,
  parseAgents,
  parseConversation
} from '../src/api';

it('shows the Kaizen error sentence, else a fixed one by status', () => {
  assert.equal(failureMessage(409, { error: { code: 'x', message: 'Already decided.' } }), 'Already decided.');
  // Not the Kaizen shape, or suspiciously long: never shown raw.
  assert.equal(
    failureMessage(500, '<html>Traceback (most recent call last)…</html>', 'send your message'),
    'Kaizen could not send your message right now (server error 500). Try again later.'
  );
  assert.equal(
    failureMessage(400, { error: { message: 'x'.repeat(500) } }, 'stop the run'),
    'Kaizen could not stop the run (error 400).'
  );
  assert.match(failureMessage(401, null), /no longer signed in/);
});

it('joins URLs and reads agents and conversations defensively', () => {
  assert.equal(apiUrl('/base', 'agents'), '/base/kaizen/api/agents');
  assert.deepEqual(parseAgents([{ id: 'g', name: 'General', mode: 'chat', version: 1, tools: ['a', 2] }, { nope: 1 }]), [
    { id: 'g', name: 'General', mode: 'chat', version: 1, tools: ['a'] }
  ]);
  assert.equal(parseAgents({ unexpected: true }), null);
  const c = parseConversation({ id: 'c', agent_id: 'g', title: '', shared: true, owner: 'alice' });
  assert.equal(c?.title, 'Conversation');
  assert.equal(c?.shared, true);
});

describe('credentialFormUrl', () => {
  const token = `${'a'.repeat(40)}.${'b'.repeat(43)}`;
  it('joins a form path under the base URL', () => {
    assert.equal(
      credentialFormUrl('/base/', `kaizen/credentials/forms/${token}`),
      `/base/kaizen/credentials/forms/${token}`
    );
    assert.equal(
      credentialFormUrl('/base', `kaizen/credentials/forms/${token}`),
      `/base/kaizen/credentials/forms/${token}`
    );
  });
  it('links only to the form page of this server', () => {
    for (const path of [
      `https://evil.example/kaizen/credentials/forms/${token}`,
      `kaizen/api/credentials/forms/${token}`,
      `kaizen/credentials/forms/${token}/../../x`,
      'kaizen/credentials/forms/short.x'
    ]) {
      assert.equal(credentialFormUrl('/base/', path), null, path);
    }
  });
});
