import assert from 'node:assert/strict';
import { describe, it } from 'node:test';

import { backoffDelay, ConversationFeed, FeedStatus, ISocket, PageResult } from '../src/events';
import { applyFrames, IConversationState, initialState } from '../src/journal';
import { IJournalEvent } from '../src/protocol';
import { CONV, delta, fullRun } from './helpers';

class FakeSocket implements ISocket {
  constructor(readonly url: string) {}
  onopen: ((ev: unknown) => void) | null = null;
  onmessage: ((ev: { data: unknown }) => void) | null = null;
  onclose: ((ev: { code: number; reason?: string }) => void) | null = null;
  onerror: ((ev: unknown) => void) | null = null;
  closed = false;
  close(): void {
    this.closed = true;
  }
  open(): void {
    this.onopen?.({});
  }
  send(frame: unknown): void {
    this.onmessage?.({ data: JSON.stringify(frame) });
  }
  drop(code = 1006): void {
    this.onclose?.({ code });
  }
}

/** A feed over a fake server holding `journal`; timers run on demand. */
function harness(journal: IJournalEvent[], pageSize = 3) {
  let state: IConversationState = initialState(CONV);
  const sockets: FakeSocket[] = [];
  const statuses: FeedStatus[] = [];
  const timers: Array<() => void> = [];
  const pageCalls: number[] = [];
  const feed = new ConversationFeed({
    conversationId: CONV,
    pageSize,
    loadPage: async (after, limit): Promise<PageResult> => {
      pageCalls.push(after);
      const events = journal.filter(e => e.seq > after).slice(0, limit);
      return { ok: true, value: { events, next: events.length ? events[events.length - 1].seq : after } };
    },
    socketUrl: after => `ws://x/events?after=${after}`,
    openSocket: url => {
      const socket = new FakeSocket(url);
      sockets.push(socket);
      return socket;
    },
    lastSeq: () => state.lastSeq,
    onFrames: (frames, live) => {
      state = applyFrames(state, frames, { announce: live });
    },
    onStatus: status => statuses.push(status),
    setTimer: fn => timers.push(fn),
    clearTimer: () => undefined
  });
  return {
    feed,
    sockets,
    statuses,
    timers,
    pageCalls,
    state: () => state
  };
}

const tick = () => new Promise(resolve => setImmediate(resolve));

describe('conversation feed', () => {
  it('pages the history, then opens the socket after the last seq', async () => {
    const journal = [...fullRun(1), ...fullRun(9, 'r2', 'b')];
    const h = harness(journal, 5);
    await h.feed.start();
    assert.deepEqual(h.pageCalls, [0, 5, 10, 15]);
    assert.equal(h.state().lastSeq, 16);
    assert.equal(h.sockets.length, 1);
    assert.equal(h.sockets[0].url, 'ws://x/events?after=16');
    h.sockets[0].open();
    assert.deepEqual(h.statuses.at(-1), { phase: 'live' });
  });

  it('resumes from the last applied seq after a drop, with no duplicate and no gap', async () => {
    const all = [...fullRun(1), ...fullRun(9, 'r2', 'b')];
    const journal = all.slice(0, 4);
    const h = harness(journal, 100);
    await h.feed.start();
    const first = h.sockets[0];
    first.open();
    for (const event of all.slice(4, 10)) {
      journal.push(event);
      first.send(event);
    }
    first.send(delta('streaming', 1, 'r2'));
    assert.equal(h.state().lastSeq, 10);
    first.drop(1006);
    assert.equal(h.statuses.at(-1)?.phase, 'reconnecting');
    // Meanwhile the server commits more.
    journal.push(...all.slice(10));
    // The reconnect timer fires: REST catch-up from seq 10, then a socket after=16.
    h.timers.shift()?.();
    await tick();
    await tick();
    assert.equal(h.sockets.length, 2);
    assert.equal(h.sockets[1].url, 'ws://x/events?after=16');
    // The new socket replays an overlap (as a server racing a notice might): ignored.
    const second = h.sockets[1];
    second.open();
    for (const event of all.slice(12)) {
      second.send(event);
    }
    const reference = applyFrames(initialState(CONV), all);
    assert.deepEqual(h.state().runOrder, reference.runOrder);
    assert.deepEqual(h.state().runs, reference.runs);
    assert.equal(h.state().lastSeq, 16);
    assert.equal(h.state().runs.r2.answers.length, 1);
    assert.equal(h.state().runs.r2.answers[0].committed, true);
  });

  it('stops on "not a participant" and does not reconnect', async () => {
    const h = harness([], 10);
    await h.feed.start();
    h.sockets[0].drop(4404);
    assert.equal(h.statuses.at(-1)?.phase, 'failed');
    assert.equal(h.timers.length, 0);
  });

  it('closes for good on dispose', async () => {
    const h = harness(fullRun(1), 10);
    await h.feed.start();
    h.feed.dispose();
    assert.equal(h.sockets[0].closed, true);
    assert.deepEqual(h.statuses.at(-1), { phase: 'closed' });
    h.sockets[0].drop();
    assert.equal(h.timers.length, 0);
  });

  it('reports a failed history load with the member-safe message', async () => {
    let statuses: FeedStatus[] = [];
    const feed = new ConversationFeed({
      conversationId: CONV,
      loadPage: async () => ({ ok: false, message: 'No such conversation.', status: 404 }),
      socketUrl: () => 'ws://x',
      openSocket: () => {
        throw new Error('must not open');
      },
      lastSeq: () => 0,
      onFrames: () => undefined,
      onStatus: s => (statuses = [...statuses, s])
    });
    await feed.start();
    assert.deepEqual(statuses.at(-1), { phase: 'failed', message: 'No such conversation.' });
  });

  it('backs off exponentially up to 15 s', () => {
    assert.deepEqual([1, 2, 3, 4, 10].map(backoffDelay), [500, 1000, 2000, 4000, 15000]);
  });
});
