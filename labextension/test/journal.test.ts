import assert from 'node:assert/strict';
import { describe, it } from 'node:test';

import {
  activeRun,
  applyFrame,
  applyFrames,
  argumentLines,
  boundedText,
  formatDuration,
  initialState,
  isBusy,
  speakable,
  queuedRuns,
  transcriptRuns
} from '../src/journal';
import { parseEvent, parseFrame } from '../src/protocol';
import { CONV, delta, ev, fullRun } from './helpers';

describe('journal reducer', () => {
  it('builds a run from a whole journal', () => {
    const state = applyFrames(initialState(CONV), fullRun(1));
    assert.equal(state.lastSeq, 8);
    assert.deepEqual(state.runOrder, ['r1']);
    const run = state.runs.r1;
    assert.equal(run.status, 'completed');
    assert.equal(run.input?.text, 'hello');
    assert.equal(run.input?.member, 'alice');
    assert.equal(run.answers.length, 1);
    assert.equal(run.answers[0].text, 'answer to hello');
    assert.equal(run.answers[0].committed, true);
    assert.equal(run.tools.length, 1);
    assert.equal(run.tools[0].outcome, 'ok');
    assert.equal(run.tools[0].capability, 'read');
    assert.equal(transcriptRuns(state).length, 1);
    assert.equal(isBusy(state), false);
  });

  it('drops duplicates by seq and returns the same state object', () => {
    const events = fullRun(1);
    const once = applyFrames(initialState(CONV), events);
    const twice = applyFrames(once, events);
    assert.equal(twice, once);
    // An overlapping replay (a reconnect from an older seq) adds only the new events.
    const more = fullRun(9, 'r2', 'again');
    const overlapped = applyFrames(once, [...events.slice(4), ...more]);
    assert.deepEqual(overlapped.runOrder, ['r1', 'r2']);
    assert.equal(overlapped.runs.r1.tools.length, 1);
    assert.equal(overlapped.runs.r1.answers.length, 1);
    assert.equal(overlapped.lastSeq, 16);
  });

  it('gives the same state whatever the page boundaries and overlaps', () => {
    const events = [...fullRun(1), ...fullRun(9, 'r2', 'b'), ...fullRun(17, 'r3', 'c')];
    const whole = applyFrames(initialState(CONV), events);
    let paged = initialState(CONV);
    for (let i = 0; i < events.length; i += 5) {
      // each page re-sends the previous page's last two events
      paged = applyFrames(paged, events.slice(Math.max(0, i - 2), i + 5));
    }
    assert.deepEqual(paged, whole);
  });

  it('ignores events of another conversation', () => {
    const other = { ...ev(1, 'input.accepted', { text: 'x' }), conversation_id: 'other' };
    const state = initialState(CONV);
    assert.equal(applyFrame(state, other), state);
  });

  it('streams live deltas and replaces them in place with the commit', () => {
    let state = applyFrames(initialState(CONV), fullRun(1).slice(0, 3));
    state = applyFrames(state, [delta('Hel'), delta('lo '), delta('wor')]);
    assert.deepEqual(state.runs.r1.answers, [{ step: 1, text: 'Hello wor', committed: false }]);
    assert.equal(state.lastSeq, 3, 'live frames never move the resume point');
    state = applyFrame(state, ev(4, 'answer.committed', { step: 1, text: 'Hello world.' }));
    assert.equal(state.runs.r1.answers.length, 1);
    assert.equal(state.runs.r1.answers[0].text, 'Hello world.');
    assert.equal(state.runs.r1.answers[0].committed, true);
    // A late delta after the commit changes nothing.
    assert.equal(applyFrame(state, delta('ld')), state);
  });

  it('restarts live text when a step is retried', () => {
    let state = applyFrames(initialState(CONV), fullRun(1).slice(0, 3));
    state = applyFrame(state, delta('partial'));
    state = applyFrame(state, ev(4, 'model.step.started', { step: 1, attempt: 2 }));
    assert.equal(state.runs.r1.answers.length, 0);
    state = applyFrame(state, delta('fresh'));
    assert.equal(state.runs.r1.answers[0].text, 'fresh');
  });

  it('drops uncommitted live text when the run ends', () => {
    let state = applyFrames(initialState(CONV), fullRun(1).slice(0, 3));
    state = applyFrame(state, delta('half an ans'));
    state = applyFrame(state, ev(4, 'run.terminal', { status: 'cancelled', reason: 'cancelled' }));
    assert.equal(state.runs.r1.answers.length, 0);
    assert.equal(state.runs.r1.status, 'cancelled');
  });

  it('ignores deltas of unknown runs and thinking goes apart', () => {
    let state = applyFrames(initialState(CONV), fullRun(1).slice(0, 3));
    assert.equal(applyFrame(state, delta('x', 1, 'unknown')), state);
    state = applyFrame(state, delta('hmm', 1, 'r1', 'thinking.delta'));
    assert.equal(state.runs.r1.thinking, 'hmm');
    assert.equal(state.runs.r1.answers.length, 0);
  });

  it('announces only committed answers from the live socket', () => {
    const history = applyFrames(initialState(CONV), fullRun(1));
    assert.equal(history.announcement, null);
    let live = applyFrames(history, fullRun(9, 'r2', 'b').slice(0, 6), { announce: true });
    live = applyFrame(live, delta('tok'), { announce: true });
    assert.equal(live.announcement, null, 'tokens are never announced');
    live = applyFrame(live, ev(15, 'answer.committed', { step: 2, text: 'Done.' }, 'r2'), { announce: true });
    assert.deepEqual(live.announcement, { seq: 15, text: 'Done.' });
  });

  it('derives the queue, the active run and busy', () => {
    let state = applyFrames(initialState(CONV), [
      ev(1, 'input.accepted', { input_id: 'i1', position: 1, text: 'first' }, 'r1'),
      ev(2, 'input.accepted', { input_id: 'i2', position: 2, text: 'second' }, 'r2'),
      ev(3, 'steering.accepted', { input_id: 'i3', position: 3, text: 'steer', kind: 'steering' }, 'r3'),
      ev(4, 'run.admitted', { model: 'm' }, 'r1')
    ]);
    assert.equal(activeRun(state)?.runId, 'r1');
    assert.deepEqual(queuedRuns(state).map(r => r.runId), ['r2', 'r3']);
    assert.equal(queuedRuns(state)[1].input?.kind, 'steering');
    assert.deepEqual(transcriptRuns(state).map(r => r.runId), ['r1']);
    assert.equal(isBusy(state), true);

    state = applyFrames(state, [
      ev(5, 'run.terminal', { status: 'completed', reason: 'answered' }, 'r1'),
      ev(6, 'run.terminal', { status: 'cancelled', reason: 'cancelled' }, 'r2')
    ]);
    assert.equal(activeRun(state), null);
    assert.deepEqual(queuedRuns(state).map(r => r.runId), ['r3']);
    // A run cancelled while queued shows in the transcript with its end.
    assert.deepEqual(transcriptRuns(state).map(r => r.runId), ['r1', 'r2']);
    state = applyFrame(state, ev(7, 'run.admitted', {}, 'r3'));
    assert.equal(queuedRuns(state).length, 0);
    assert.equal(isBusy(state), true);
  });

  it('keeps a tool timeline with durations, outcomes and running calls', () => {
    let state = applyFrames(initialState(CONV), fullRun(1).slice(0, 3));
    state = applyFrames(state, [
      ev(4, 'tool.requested', { step: 1, call_id: 'a', name: 'read_file' }),
      ev(5, 'tool.requested', { step: 1, call_id: 'b', name: 'run_code' }),
      ev(6, 'tool.settled', { call_id: 'a', name: 'read_file', outcome: 'timeout', capability: 'read', content: 'slow' })
    ]);
    const [a, b] = state.runs.r1.tools;
    assert.equal(a.name, 'read_file');
    assert.equal(a.outcome, 'timeout');
    assert.ok(a.settledAt && Date.parse(a.settledAt) > Date.parse(a.requestedAt));
    assert.equal(b.outcome, undefined, 'still running');
    // A settle without a request (defensive) still shows up.
    state = applyFrame(state, ev(7, 'tool.settled', { call_id: 'c', name: 'x', outcome: 'error' }));
    assert.equal(state.runs.r1.tools.length, 3);
    // A replayed request does not add a row.
    state = applyFrame(state, ev(8, 'tool.requested', { call_id: 'a', name: 'read_file' }));
    assert.equal(state.runs.r1.tools.length, 3);
  });

  it('follows approvals: pending, then decided, for every viewer', () => {
    let state = applyFrames(initialState(CONV), fullRun(1).slice(0, 3));
    state = applyFrame(state, ev(4, 'tool.requested', { step: 1, call_id: 'w', name: 'write_file' }));
    state = applyFrame(
      state,
      ev(5, 'approval.requested', {
        approval_id: 'ap1',
        tool: 'write_file',
        capability: 'write',
        arguments: { path: 'a.txt' },
        args_digest: 'abc'
      })
    );
    assert.equal(state.runs.r1.status, 'awaiting_approval');
    assert.equal(state.runs.r1.tools[0].capability, 'write', 'the waiting call learns it');
    assert.equal(state.runs.r1.approvals[0].decision, undefined);
    state = applyFrame(state, ev(6, 'approval.decided', { approval_id: 'ap1', decision: 'approved' }, 'r1', 'alice'));
    assert.equal(state.runs.r1.status, 'running');
    assert.equal(state.runs.r1.approvals[0].decision, 'approved');
    assert.equal(state.runs.r1.approvals[0].decidedBy, 'alice');
  });

  it('follows a call paused for a credential: the form path, then how it settled', () => {
    let state = applyFrames(initialState(CONV), fullRun(1).slice(0, 3));
    state = applyFrame(state, ev(4, 'tool.requested', { step: 1, call_id: 'c', name: 'openapi__s1__op' }));
    state = applyFrame(
      state,
      ev(5, 'credential.requested', {
        request_id: 'rq1',
        call_id: 'c',
        tool: 'openapi__s1__op',
        origin: 'https://api.example',
        effect: 'write',
        approval_id: 'ap1',
        form_path: 'kaizen/credentials/forms/tok',
        expires_at: '2026-12-06T12:05:00+00:00'
      })
    );
    const [request] = state.runs.r1.credentials ?? [];
    assert.equal(state.runs.r1.status, 'awaiting_approval');
    assert.equal(request.origin, 'https://api.example');
    assert.equal(request.approvalId, 'ap1');
    assert.equal(request.formPath, 'kaizen/credentials/forms/tok');
    assert.equal(request.status, undefined);
    state = applyFrame(state, ev(6, 'credential.settled', { request_id: 'rq1', status: 'submitted' }));
    assert.equal(state.runs.r1.status, 'running');
    assert.equal(state.runs.r1.credentials?.[0].status, 'submitted');
  });

  it('notes participants', () => {
    const state = applyFrame(initialState(CONV), ev(1, 'participant.added', { member: 'bob' }, null));
    assert.equal(state.notes[0].text, 'bob joined the conversation.');
  });

  it('advances lastSeq over unknown event types', () => {
    const state = applyFrame(initialState(CONV), ev(1, 'artifact.version', {}, null));
    assert.equal(state.lastSeq, 1);
  });
});

describe('formatting helpers', () => {
  it('formats durations', () => {
    assert.equal(formatDuration(850), '850 ms');
    assert.equal(formatDuration(2400), '2.4 s');
    assert.equal(formatDuration(65000), '1 min 5 s');
  });

  it('bounds and pretty-prints tool content', () => {
    assert.equal(boundedText('{"a":1}').text, '{\n  "a": 1\n}');
    const long = boundedText('x'.repeat(50), 10);
    assert.equal(long.truncated, true);
    assert.match(long.text, /40 more characters/);
    assert.equal(boundedText(undefined).text, '');
  });

  it('turns Markdown into a speakable sentence', () => {
    assert.equal(
      speakable('## Title\n\nThis is **bold**, `code` and a [link](http://x).\n\n```py\nprint(1)\n```\n<b>x</b>'),
      'Title This is bold, code and a link. (code) x'
    );
    assert.equal(speakable('a'.repeat(20), 5), 'aaaaa…');
  });

  it('lists approval arguments readably', () => {
    assert.deepEqual(argumentLines({ path: 'a.txt', n: 2 }), [
      ['path', 'a.txt'],
      ['n', '2']
    ]);
  });
});

describe('protocol parsing', () => {
  it('reads durable and live frames, rejects junk', () => {
    assert.equal(parseEvent({ seq: 0, type: 'x' }), null);
    assert.equal(parseEvent({ seq: 1.5, type: 'x' }), null);
    assert.equal(parseFrame('nope'), null);
    const live = parseFrame({ live: true, type: 'answer.delta', run_id: 'r', data: { text: 'a' } });
    assert.equal(live?.live, true);
    const durable = parseFrame({ seq: 3, type: 'run.admitted', run_id: 'r', data: {}, live: false });
    assert.equal(durable?.live, false);
  });
});

describe('escaped event data', () => {
  it('shows what the server escaped exactly as it was', () => {
    const event = parseEvent({
      seq: 3,
      conversation_id: CONV,
      run_id: 'r1',
      type: 'answer.committed',
      actor: 'alice',
      at: '',
      // The server's stated escaping of "x\u0000y C:\\dir \ud800" (store/storable.py).
      data: { text: 'x\\u0000y C:\\\\dir \\ud800', step: 1, text_escaped: true }
    });
    assert.deepEqual(event?.data, { text: 'x\u0000y C:\\dir \ud800', step: 1 });
  });

  it('leaves data that was not escaped alone, backslashes included', () => {
    const data = { text: 'C:\\dir \\u0000 literally', step: 1 };
    const event = parseEvent({ seq: 4, type: 'answer.committed', data });
    assert.deepEqual(event?.data, data);
  });
});
