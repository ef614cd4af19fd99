import assert from 'node:assert/strict';
import { describe, it } from 'node:test';

import {
  applyFrames,
  conversationUsage,
  formatCost,
  formatTokens,
  initialState,
  MAX_THINKING_CHARS,
  parseUsage,
  runUsage,
  usageSummary
} from '../src/journal';
import { CONV, delta, ev } from './helpers';

/** A run with two model steps: usage in `answer.committed` is the run's running total. */
function runWithUsage(start: number, run: string, usage: Record<string, unknown>) {
  return [
    ev(start, 'input.accepted', { input_id: `i-${run}`, position: start, text: 'q', kind: 'message' }, run),
    ev(start + 1, 'run.admitted', { model: 'fake-model', agent_id: 'general', agent_version: 3, tools: [] }, run),
    ev(start + 2, 'model.step.started', { step: 1 }, run),
    ev(start + 3, 'answer.committed', { step: 1, text: 'a', model: 'fake-model', usage }, run),
    ev(start + 4, 'run.terminal', { status: 'completed', reason: 'answered' }, run)
  ];
}

describe('usage', () => {
  it('reads the usage block defensively and derives a missing total', () => {
    assert.deepEqual(parseUsage({ prompt_tokens: 11, completion_tokens: 4 }), {
      prompt_tokens: 11,
      completion_tokens: 4,
      total_tokens: 15,
      cost: null
    });
    assert.deepEqual(
      parseUsage({ prompt_tokens: 1, completion_tokens: 2, total_tokens: 3, cost: 0.25 }),
      { prompt_tokens: 1, completion_tokens: 2, total_tokens: 3, cost: 0.25 }
    );
    assert.equal(parseUsage({}), undefined);
    assert.equal(parseUsage('12'), undefined);
    assert.deepEqual(parseUsage({ prompt_tokens: -1, completion_tokens: 'x', total_tokens: 7 }), {
      total_tokens: 7,
      cost: null
    });
  });

  it('keeps the model, agent and agent version that produced each answer', () => {
    const state = applyFrames(initialState(CONV), runWithUsage(1, 'r1', { prompt_tokens: 10, completion_tokens: 5, total_tokens: 15, cost: null }));
    const run = state.runs.r1;
    assert.equal(run.model, 'fake-model');
    assert.equal(run.agentId, 'general');
    assert.equal(run.agentVersion, 3);
    assert.equal(run.answers[0].model, 'fake-model');
    assert.deepEqual(runUsage(run), { prompt_tokens: 10, completion_tokens: 5, total_tokens: 15, cost: null });
  });

  it("takes a run's usage from its last committed answer (running totals, not summed)", () => {
    const events = [
      ev(1, 'input.accepted', { input_id: 'i', position: 1, text: 'q' }, 'r1'),
      ev(2, 'run.admitted', { model: 'm', agent_id: 'general' }, 'r1'),
      ev(3, 'answer.committed', { step: 1, text: 'first', usage: { prompt_tokens: 5, completion_tokens: 1 } }, 'r1'),
      ev(4, 'answer.committed', { step: 2, text: 'second', usage: { prompt_tokens: 12, completion_tokens: 3 } }, 'r1')
    ];
    const state = applyFrames(initialState(CONV), events);
    assert.equal(runUsage(state.runs.r1)?.total_tokens, 15);
    assert.equal(conversationUsage(state).totalTokens, 15);
  });

  it('sums tokens per conversation; cost only when some provider reported it', () => {
    const noCost = applyFrames(initialState(CONV), [
      ...runWithUsage(1, 'r1', { prompt_tokens: 10, completion_tokens: 5 }),
      ...runWithUsage(6, 'r2', { prompt_tokens: 20, completion_tokens: 7 })
    ]);
    assert.deepEqual(conversationUsage(noCost), {
      promptTokens: 30,
      completionTokens: 12,
      totalTokens: 42,
      cost: null,
      runs: 2
    });
    const withCost = applyFrames(noCost, runWithUsage(11, 'r3', { prompt_tokens: 1, completion_tokens: 1, cost: 0.002 }));
    assert.equal(conversationUsage(withCost).cost, 0.002);
    assert.equal(conversationUsage(withCost).totalTokens, 44);
    // A failed run without an answer reports nothing.
    const failed = applyFrames(withCost, [
      ev(16, 'input.accepted', { input_id: 'i4', position: 4, text: 'x' }, 'r4'),
      ev(17, 'run.terminal', { status: 'failed', reason: 'model_not_configured' }, 'r4')
    ]);
    assert.equal(conversationUsage(failed).runs, 3);
  });

  it('formats tokens and cost for the panel', () => {
    assert.equal(formatTokens(950), '950');
    assert.equal(formatTokens(1234567), '1,234,567');
    assert.equal(formatCost(0.0042), '$0.0042');
    assert.equal(formatCost(1.5), '$1.50');
    assert.equal(formatCost(0), '$0');
    assert.equal(usageSummary({ prompt: 1000, completion: 234, total: 1234, cost: null }), '1,234 tokens (1,000 in, 234 out)');
    assert.equal(usageSummary({ total: 7, cost: 0.02 }), '7 tokens · $0.02');
    assert.equal(usageSummary({}), '');
  });
});

describe('thinking', () => {
  const start = [
    ev(1, 'input.accepted', { input_id: 'i', position: 1, text: 'q' }),
    ev(2, 'run.admitted', { model: 'm' }),
    ev(3, 'model.step.started', { step: 1 })
  ];

  it('accumulates live thinking of the current step and never from durable events', () => {
    let state = applyFrames(initialState(CONV), start);
    assert.equal(state.runs.r1.thinking, undefined);
    state = applyFrames(state, [delta('Let me ', 1, 'r1', 'thinking.delta'), delta('look.', 1, 'r1', 'thinking.delta')]);
    assert.equal(state.runs.r1.thinking, 'Let me look.');
    // A durable event of the same type (it should never be journaled) is ignored.
    state = applyFrames(state, [ev(4, 'thinking.delta', { step: 1, text: 'stored?' })]);
    assert.equal(state.runs.r1.thinking, 'Let me look.');
    // The next step starts its own thinking.
    state = applyFrames(state, [ev(5, 'model.step.started', { step: 2 }), delta('Again.', 2, 'r1', 'thinking.delta')]);
    assert.equal(state.runs.r1.thinking, 'Again.');
  });

  it('drops thinking when the run ends, and ignores it for an ended run', () => {
    let state = applyFrames(initialState(CONV), [...start, delta('hmm', 1, 'r1', 'thinking.delta')]);
    state = applyFrames(state, [
      ev(4, 'answer.committed', { step: 1, text: 'done' }),
      ev(5, 'run.terminal', { status: 'completed', reason: 'answered' })
    ]);
    assert.equal(state.runs.r1.thinking, undefined);
    const after = applyFrames(state, [delta('late', 1, 'r1', 'thinking.delta')]);
    assert.equal(after, state);
  });

  it('keeps only the latest part of a very long thinking stream', () => {
    let state = applyFrames(initialState(CONV), start);
    const chunk = 'x'.repeat(MAX_THINKING_CHARS / 2);
    state = applyFrames(state, [
      delta('START', 1, 'r1', 'thinking.delta'),
      delta(chunk, 1, 'r1', 'thinking.delta'),
      delta(chunk, 1, 'r1', 'thinking.delta'),
      delta('END', 1, 'r1', 'thinking.delta')
    ]);
    const thinking = state.runs.r1.thinking ?? '';
    assert.equal(thinking.length, MAX_THINKING_CHARS);
    assert.ok(thinking.endsWith('END'));
    assert.ok(!thinking.includes('START'));
  });
});
