import { IJournalEvent, ILiveFrame } from '../src/protocol';

export const CONV = 'c1';

let clock = Date.parse('2026-01-01T00:00:00Z');

export function ev(
  seq: number,
  type: string,
  data: Record<string, unknown> = {},
  run: string | null = 'r1',
  actor = 'alice'
): IJournalEvent {
  clock += 1000;
  return {
    seq,
    conversation_id: CONV,
    run_id: run,
    type,
    actor,
    at: new Date(clock).toISOString(),
    data,
    live: false
  };
}

export function delta(text: string, step = 1, run = 'r1', type = 'answer.delta'): ILiveFrame {
  return { live: true, type, conversation_id: CONV, run_id: run, data: { step, text } };
}

/** A whole run: message, admitted, one tool call, an answer, completed. */
export function fullRun(start: number, run = 'r1', text = 'hello'): IJournalEvent[] {
  return [
    ev(start, 'input.accepted', { input_id: `i-${run}`, position: start, text, kind: 'message' }, run),
    ev(start + 1, 'run.admitted', { model: 'fake-model', agent_id: 'general', tools: [] }, run),
    ev(start + 2, 'model.step.started', { step: 1, attempt: 1 }, run),
    ev(start + 3, 'tool.requested', { step: 1, call_id: `call-${run}`, name: 'list_available_agents' }, run),
    ev(
      start + 4,
      'tool.settled',
      { step: 1, call_id: `call-${run}`, name: 'list_available_agents', outcome: 'ok', capability: 'read', content: '{"agents": []}' },
      run
    ),
    ev(start + 5, 'model.step.started', { step: 2, attempt: 1 }, run),
    ev(start + 6, 'answer.committed', { step: 2, text: `answer to ${text}`, model: 'fake-model', usage: { total_tokens: 3 } }, run),
    ev(start + 7, 'run.terminal', { status: 'completed', reason: 'answered' }, run)
  ];
}
