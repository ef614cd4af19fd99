import assert from 'node:assert/strict';
import { describe, it } from 'node:test';

import { IConversation, KaizenApi, Result } from '../src/api';
import { canAllowForConversation } from '../src/components/ApprovalCard';
import { GrantsModel, parseGrants } from '../src/grants';
import { applyFrames, initialState } from '../src/journal';
import {
  matchingEntries,
  mentionedPaths,
  parseAttachment,
  pathQuery,
  splitQuery,
  suggestedPath
} from '../src/jupyterFiles';
import { ConversationModel, MAX_ATTACHMENTS } from '../src/model';
import { ev } from './helpers';

const CONVERSATION: IConversation = {
  id: 'c1', agent_id: 'general', title: 'c1', shared: false, owner: 'alice',
  audience_version: 1, participants: ['alice'], last_seq: 0
};

function artifactAnswer(path: string, id = `a-${path}`): unknown {
  return { path, reused: false, artifact: { id, version: 1, title: path.split('/').pop(), size: 12, mime: 'text/csv' } };
}

/** A fake Kaizen API recording JSON calls and posted messages. */
function fakeApi(files: Record<string, unknown> = {}) {
  const calls: Array<{ method: string; path: string; body: unknown }> = [];
  const posts: Array<Record<string, unknown>> = [];
  const decisions: unknown[][] = [];
  const api = {
    call: <T>(method: string, path: string, body: unknown, _action: string,
              parse: (b: unknown) => T | null): Promise<Result<T>> => {
      calls.push({ method, path, body });
      if (path === 'jupyter-files') {
        const wanted = (body as { path: string }).path;
        const answer = files[wanted];
        if (answer === undefined) {
          return Promise.resolve({ ok: false, message: 'There is no such file in the Jupyter server\'s root.', status: 404 });
        }
        return Promise.resolve({ ok: true, value: parse(answer) as T });
      }
      return Promise.resolve({ ok: true, value: parse([]) as T });
    },
    postMessage: (_id: string, body: Record<string, unknown>) => {
      posts.push(body);
      return Promise.resolve({ ok: true, value: { input_id: 'i', position: 1, run_id: 'r' } });
    },
    decideApproval: (...args: unknown[]) => {
      decisions.push(args);
      return Promise.resolve({ ok: true, value: {} });
    }
  };
  return { api: api as unknown as KaizenApi, calls, posts, decisions };
}

describe('@path mentions', () => {
  it('finds file-like tokens, once each, without sentence punctuation', () => {
    assert.deepEqual(
      mentionedPaths('Sum @data/sales.csv, then @notes.md. Ask @alice; again @data/sales.csv'),
      ['data/sales.csv', 'notes.md']
    );
    assert.deepEqual(mentionedPaths('mail me at bob@example.com'), []);
  });

  it('knows the token being typed and splits it into folder and prefix', () => {
    assert.deepEqual(pathQuery('look at @data/sa', 16), { start: 8, query: 'data/sa' });
    assert.equal(pathQuery('look at data', 12), null);
    assert.deepEqual(splitQuery('data/sa'), { folder: 'data', prefix: 'sa' });
    assert.deepEqual(splitQuery('sa'), { folder: '', prefix: 'sa' });
  });

  it('offers folders first, hidden entries only when asked for', () => {
    const entries = [
      { name: 'sales.csv', path: 'data/sales.csv', directory: false },
      { name: 'sandbox', path: 'data/sandbox', directory: true },
      { name: '.secret', path: 'data/.secret', directory: false },
      { name: 'other.csv', path: 'data/other.csv', directory: false }
    ];
    assert.deepEqual(matchingEntries(entries, 'sa').map(e => e.name), ['sandbox', 'sales.csv']);
    assert.deepEqual(matchingEntries(entries, '').map(e => e.name), ['sandbox', 'other.csv', 'sales.csv']);
    assert.deepEqual(matchingEntries(entries, '.').map(e => e.name), ['.secret']);
  });
});

describe('attachments on the next message', () => {
  it('reads @path files through the server and sends their ids once', async () => {
    const { api, calls, posts } = fakeApi({ 'data/sales.csv': artifactAnswer('data/sales.csv') });
    const model = new ConversationModel(api, CONVERSATION);
    assert.equal(await model.send('Total of @data/sales.csv?', 'message'), true);
    assert.deepEqual(calls.map(c => [c.method, c.path, c.body]), [
      ['POST', 'jupyter-files', { path: 'data/sales.csv' }]
    ]);
    assert.deepEqual(posts[0].attachments, ['a-data/sales.csv']);
    assert.deepEqual(model.getSnapshot().attachments, [], 'sent: the chips are cleared');
  });

  it('does not send when an @path cannot be read, and keeps the text', async () => {
    const { api, posts } = fakeApi({});
    const model = new ConversationModel(api, CONVERSATION);
    assert.equal(await model.send('Look at @data/missing.csv', 'message'), false);
    assert.equal(posts.length, 0);
    assert.match(model.getSnapshot().error ?? '', /^@data\/missing\.csv: There is no such file/);
  });

  it('attaches from the file browser, replaces a re-read file and detaches', async () => {
    const { api, posts } = fakeApi({
      'a.csv': artifactAnswer('a.csv', 'A'),
      'b.csv': artifactAnswer('b.csv', 'B')
    });
    const model = new ConversationModel(api, CONVERSATION);
    assert.equal(await model.attach('a.csv'), true);
    assert.equal(await model.attach('b.csv'), true);
    assert.equal(await model.attach('a.csv'), true);
    assert.deepEqual(model.getSnapshot().attachments.map(a => a.artifactId), ['B', 'A']);
    model.detach('B');
    await model.send('go', 'message');
    assert.deepEqual(posts[0].attachments, ['A']);
    // A message without files carries no attachments field at all.
    await model.send('plain', 'message');
    assert.equal('attachments' in posts[1], false);
  });

  it('refuses a ninth file', async () => {
    const files: Record<string, unknown> = {};
    for (let i = 0; i <= MAX_ATTACHMENTS; i++) {
      files[`f${i}.csv`] = artifactAnswer(`f${i}.csv`);
    }
    const { api } = fakeApi(files);
    const model = new ConversationModel(api, CONVERSATION);
    for (let i = 0; i < MAX_ATTACHMENTS; i++) {
      assert.equal(await model.attach(`f${i}.csv`), true);
    }
    assert.equal(await model.attach(`f${MAX_ATTACHMENTS}.csv`), false);
    assert.match(model.getSnapshot().error ?? '', /at most 8 files/);
  });

  it('reads the server answer of a Jupyter file', () => {
    assert.deepEqual(parseAttachment(artifactAnswer('data/sales.csv', 'X')), {
      path: 'data/sales.csv', artifactId: 'X', version: 1, filename: 'sales.csv', size: 12, mime: 'text/csv'
    });
    assert.equal(parseAttachment({ path: 'x' }), null);
  });
});

describe('save to the Jupyter folder', () => {
  it('proposes the notebook folder and the download name', () => {
    assert.equal(suggestedPath('work/nb', { title: 'Summary', kind: 'markdown', governed: false }), 'work/nb/Summary.md');
    assert.equal(suggestedPath('', { title: 'chart.png', kind: 'file', governed: false }), 'chart.png');
    assert.equal(suggestedPath('/', { title: '../.evil/x', kind: 'file', governed: false }), '_.evil_x');
  });
});

describe('allow for this conversation', () => {
  it('is offered for writes only', () => {
    const base = { approvalId: 'a', tool: 't', arguments: {}, argsDigest: 'd', requestedAt: '', seq: 1 };
    assert.equal(canAllowForConversation({ ...base, capability: 'write' }), true);
    assert.equal(canAllowForConversation({ ...base, capability: 'sensitive' }), false);
    assert.equal(canAllowForConversation({ ...base, capability: 'undeclared' }), false);
  });

  it('sends the conversation scope with an approval', async () => {
    const { api, decisions } = fakeApi();
    const model = new ConversationModel(api, CONVERSATION);
    await model.decide('ap1', 'allow_conversation');
    await model.decide('ap2', 'approve');
    assert.deepEqual(decisions, [['ap1', 'approve', 'conversation'], ['ap2', 'approve']]);
  });

  it('shows a card decided for the conversation as such', () => {
    const state = applyFrames(initialState('c1'), [
      ev(1, 'input.accepted', { input_id: 'i1', position: 1, text: 'x' }),
      ev(2, 'approval.requested', { approval_id: 'ap', tool: 'run_code', capability: 'write' }),
      ev(3, 'approval.decided', { approval_id: 'ap', decision: 'approved', tool: 'run_code', scope: 'conversation' })
    ]);
    const [approval] = state.runs.r1.approvals;
    assert.equal(approval.scope, 'conversation');
    assert.equal(approval.decision, 'approved');
  });

  it('lists and revokes the grants of the conversation', async () => {
    const { api, calls } = fakeApi();
    const grants = new GrantsModel(api, 'c 1');
    await grants.revoke('run_code');
    assert.deepEqual(calls.map(c => [c.method, c.path]), [
      ['DELETE', 'conversations/c%201/tool-grants/run_code'],
      ['GET', 'conversations/c%201/tool-grants']
    ]);
    assert.deepEqual(parseGrants([{ tool: 'run_code', granted_at: 't' }, { nope: 1 }]), [
      { tool: 'run_code', grantedAt: 't' }
    ]);
  });
});
