import assert from 'node:assert/strict';
import { describe, it } from 'node:test';

import { IAgent, IApprovalRequest, IConversation, KaizenApi, Result } from '../src/api';
import { ISocket } from '../src/events';
import { ConversationModel, liveActivity, PanelModel } from '../src/model';
import { applyFrames, initialState } from '../src/journal';
import { IJournalEvent } from '../src/protocol';
import { ev } from './helpers';

class FakeSocket implements ISocket {
  onopen: ((ev: unknown) => void) | null = null;
  onmessage: ((ev: { data: unknown }) => void) | null = null;
  onclose: ((ev: { code: number; reason?: string }) => void) | null = null;
  onerror: ((ev: unknown) => void) | null = null;
  closed = false;
  close(): void {
    this.closed = true;
  }
  send(frame: unknown): void {
    this.onmessage?.({ data: JSON.stringify(frame) });
  }
}

function conversation(id: string): IConversation {
  return {
    id,
    agent_id: 'general',
    title: id,
    shared: false,
    owner: 'alice',
    audience_version: 1,
    participants: ['alice'],
    last_seq: 0
  };
}

/** A fake server: conversations with journals, pending approvals, recorded posts. */
function fakeServer(options: { journals?: Record<string, IJournalEvent[]>; approvals?: IApprovalRequest[] } = {}) {
  const journals = options.journals ?? {};
  const conversations = Object.keys(journals).map(conversation);
  const posts: Array<{ id: string; text: string }> = [];
  const acks: Array<Record<string, unknown>> = [];
  const created: Array<Record<string, unknown>> = [];
  const agents: IAgent[] = [
    { id: 'general', name: 'General', mode: 'chat' },
    { id: 'search', name: 'Search', mode: 'chat' }
  ];
  const ok = <T>(value: T): Promise<Result<T>> => Promise.resolve({ ok: true, value });
  const api = {
    agents: () => ok(agents),
    me: () => ok({ member: 'alice', admin: false }),
    conversations: () => ok([...conversations]),
    pendingApprovals: () => ok(options.approvals ?? []),
    createConversation: (body: { agent_id: string; title?: string; shared?: boolean }) => {
      created.push(body);
      const c = { ...conversation(`new-${created.length}`), agent_id: body.agent_id, title: body.title ?? '' };
      conversations.push(c);
      journals[c.id] = [];
      return ok(c);
    },
    postMessage: (id: string, body: { text: string }) => {
      posts.push({ id, text: body.text });
      return ok({ input_id: 'i', position: 1, run_id: 'r' });
    },
    journal: (id: string, after: number) => {
      const events = (journals[id] ?? []).filter(e => e.seq > after);
      return ok({ events, next: events.length ? events[events.length - 1].seq : after });
    },
    eventsUrl: (id: string, after: number) => `ws://x/${id}?after=${after}`,
    acknowledgeOpen: (destination: Record<string, unknown>) => {
      acks.push(destination);
      return ok({ acknowledged: [] });
    }
  };
  return { api: api as unknown as KaizenApi, posts, created, acks };
}

/** A panel whose conversation models use fake sockets (kept per conversation). */
class TestPanel extends PanelModel {
  sockets = new Map<string, FakeSocket>();
  protected _newModel(c: IConversation): ConversationModel {
    return new ConversationModel(this.api, c, () => {
      const socket = new FakeSocket();
      this.sockets.set(c.id, socket);
      setTimeout(() => socket.onopen?.({}), 0);
      return socket;
    });
  }
}

const settle = () => new Promise(resolve => setTimeout(resolve, 30));

function busyRun(conversationId: string): IJournalEvent[] {
  return [
    { ...ev(1, 'input.accepted', { input_id: 'i1', position: 1, text: 'slow' }, 'r1'), conversation_id: conversationId },
    { ...ev(2, 'run.admitted', { model: 'm', agent_id: 'general' }, 'r1'), conversation_id: conversationId }
  ];
}

describe('conversation list badges', () => {
  it('shows pending approvals from the server for conversations not watched', async () => {
    const { api } = fakeServer({
      journals: { c1: [], c2: [] },
      approvals: [
        { id: 'a1', run_id: 'r', conversation_id: 'c2', tool: 'write_file', capability: 'write', arguments: {}, args_digest: 'd', status: 'pending' },
        { id: 'a2', run_id: 'r', conversation_id: 'c2', tool: 'write_file', capability: 'write', arguments: {}, args_digest: 'd', status: 'pending' }
      ]
    });
    const panel = new TestPanel(api);
    await panel.refresh();
    assert.deepEqual(panel.getSnapshot().activity, { c2: { busy: false, approvals: 2 } });
  });

  it('shows busy for a conversation not watched when the listing has an active run', async () => {
    const { api } = fakeServer({ journals: { c1: [], c2: [] } });
    const listed = await api.conversations();
    assert.ok(listed.ok);
    const withActive = listed.value.map(c =>
      c.id === 'c1' ? { ...c, active_run: { id: 'r9', status: 'running' } } : c
    );
    const panel = new TestPanel({ ...api, conversations: () => Promise.resolve({ ok: true, value: withActive }) } as typeof api);
    await panel.refresh();
    assert.deepEqual(panel.getSnapshot().activity, { c1: { busy: true, approvals: 0 } });
  });

  it('keeps a busy conversation watched after leaving it, until it settles', async () => {
    const { api } = fakeServer({ journals: { c1: busyRun('c1') } });
    const panel = new TestPanel(api);
    await panel.refresh();
    panel.select('c1');
    await settle();
    assert.deepEqual(panel.getSnapshot().activity, { c1: { busy: true, approvals: 0 } });
    panel.select(null);
    const model = panel.conversationModel('c1')!;
    assert.equal(model.watching, true, 'a busy conversation stays live in the background');
    const socket = panel.sockets.get('c1')!;
    socket.send({ ...ev(3, 'approval.requested', { approval_id: 'ap', tool: 'write_file', capability: 'write' }, 'r1'), conversation_id: 'c1' });
    await settle();
    assert.deepEqual(panel.getSnapshot().activity, { c1: { busy: true, approvals: 1 } });
    socket.send({ ...ev(4, 'approval.decided', { approval_id: 'ap', decision: 'approve' }, 'r1'), conversation_id: 'c1' });
    socket.send({ ...ev(5, 'run.terminal', { status: 'completed', reason: 'answered' }, 'r1'), conversation_id: 'c1' });
    await settle();
    assert.deepEqual(panel.getSnapshot().activity, {});
    assert.equal(model.watching, false, 'settled in the background: the socket is closed');
    assert.equal(socket.closed, true);
  });

  it('acknowledges the notices of exactly the conversation it opens (R-033)', async () => {
    const { api, acks } = fakeServer({ journals: { c1: [], c2: [] } });
    const panel = new TestPanel(api);
    await panel.refresh();
    panel.select('c2');
    panel.select(null);
    panel.select('c1');
    await settle();
    assert.deepEqual(acks, [
      { kind: 'chat', resource_id: 'c2' },
      { kind: 'chat', resource_id: 'c1' }
    ]);
  });

  it('stops an idle conversation at once when leaving it', async () => {
    const { api } = fakeServer({ journals: { c1: [] } });
    const panel = new TestPanel(api);
    await panel.refresh();
    panel.select('c1');
    await settle();
    panel.select(null);
    assert.equal(panel.conversationModel('c1')!.watching, false);
  });

  it('derives badges from a journal', () => {
    const state = applyFrames(initialState('c1'), [
      ...busyRun('c1').map(e => ({ ...e, conversation_id: 'c1' })),
      { ...ev(3, 'approval.requested', { approval_id: 'ap', tool: 't' }, 'r1'), conversation_id: 'c1' }
    ]);
    assert.deepEqual(liveActivity(state), { busy: true, approvals: 1 });
    assert.deepEqual(liveActivity(initialState('c1')), { busy: false, approvals: 0 });
  });
});

describe('ask from a notebook', () => {
  it('sends into the open conversation', async () => {
    const { api, posts, created } = fakeServer({ journals: { c1: [] } });
    const panel = new TestPanel(api);
    await panel.refresh();
    panel.select('c1');
    const problem = await panel.ask('About cell 2', 'About x.ipynb, cell 2');
    assert.equal(problem, null);
    assert.deepEqual(posts, [{ id: 'c1', text: 'About cell 2' }]);
    assert.equal(created.length, 0);
  });

  it('starts a private conversation with the default agent when none is open', async () => {
    const { api, posts, created } = fakeServer({ journals: {} });
    const panel = new TestPanel(api);
    panel.preferences.update({ defaultAgent: 'search' });
    const problem = await panel.ask('Explain', 'About x.ipynb, cell 0');
    assert.equal(problem, null);
    assert.deepEqual(created, [{ agent_id: 'search', shared: false, title: 'About x.ipynb, cell 0' }]);
    assert.equal(panel.getSnapshot().selectedId, 'new-1');
    assert.deepEqual(posts, [{ id: 'new-1', text: 'Explain' }]);
    panel.dispose();
  });
});
