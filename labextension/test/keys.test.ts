import assert from 'node:assert/strict';
import { it } from 'node:test';

import { isSendKey } from '../src/keys';

const key = (over: Partial<Parameters<typeof isSendKey>[0]> = {}) => ({
  key: 'Enter',
  shiftKey: false,
  ctrlKey: false,
  metaKey: false,
  altKey: false,
  ...over
});

it('Enter sends, Shift+Enter is a new line', () => {
  assert.equal(isSendKey(key(), 'Enter'), true);
  assert.equal(isSendKey(key({ shiftKey: true }), 'Enter'), false);
  assert.equal(isSendKey(key({ key: 'a' }), 'Enter'), false);
  assert.equal(isSendKey(key({ isComposing: true }), 'Enter'), false);
});

it('Mod+Enter mode: only Ctrl/Cmd+Enter sends', () => {
  assert.equal(isSendKey(key(), 'Mod+Enter'), false);
  assert.equal(isSendKey(key({ ctrlKey: true }), 'Mod+Enter'), true);
  assert.equal(isSendKey(key({ metaKey: true }), 'Mod+Enter'), true);
});
