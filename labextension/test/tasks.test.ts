import assert from 'node:assert/strict';
import { describe, it } from 'node:test';

import { Result } from '../src/api';
import { cadenceLabel, parseTasks, TasksModel } from '../src/tasks';

const TASK = {
  id: 't1',
  conversation_id: 'c1',
  name: 'Morning numbers',
  prompt: 'Re-run the sales analysis',
  interval_seconds: 86400,
  next_due_at: '2026-12-04T08:00:00+00:00',
  status: 'active',
  version: 3,
  missed_firings: 0
};

/** A fake API answering from a list of canned results, recording each request. */
function fakeApi(answers: Record<string, Result<unknown>>) {
  const calls: { method: string; path: string; body: unknown }[] = [];
  const api = {
    call: <T>(
      method: string,
      path: string,
      body: unknown,
      _action: string,
      parse: (body: unknown) => T | null
    ): Promise<Result<T>> => {
      calls.push({ method, path, body });
      const answer = answers[`${method} ${path}`] ?? { ok: false, message: 'nope', status: 500 };
      if (!answer.ok) {
        return Promise.resolve(answer);
      }
      const value = parse(answer.value);
      return Promise.resolve(
        value === null ? { ok: false, message: 'unreadable', status: 200 } : { ok: true, value }
      );
    }
  };
  return { api, calls };
}

describe('tasks in the panel', () => {
  it('reads tasks defensively and keeps this conversation’s only', async () => {
    assert.equal(parseTasks({ not: 'a list' }), null);
    const { api } = fakeApi({
      'GET tasks': { ok: true, value: [TASK, { ...TASK, id: 't2', conversation_id: 'other' }, 7] }
    });
    const model = new TasksModel(api, 'c1');
    await model.refresh();
    assert.deepEqual(
      model.getSnapshot().tasks.map(t => t.id),
      ['t1']
    );
  });

  it('creates with the chosen cadence in this conversation, and names it from the prompt', async () => {
    const { api, calls } = fakeApi({
      'POST tasks': { ok: true, value: TASK },
      'GET tasks': { ok: true, value: [TASK] }
    });
    const model = new TasksModel(api, 'c1');
    assert.equal(await model.create('', 'Re-run the sales analysis', 'daily'), true);
    assert.deepEqual(calls[0], {
      method: 'POST',
      path: 'tasks',
      body: {
        name: 'Re-run the sales analysis',
        prompt: 'Re-run the sales analysis',
        conversation_id: 'c1',
        interval_seconds: 86400
      }
    });
    await model.create('By hand', 'x', 'manual');
    assert.equal((calls[2].body as Record<string, unknown>).interval_seconds, undefined);
  });

  it('runs as a safe test, pauses with the version it saw, and shows what failed', async () => {
    const { api, calls } = fakeApi({
      'POST tasks/t1/run': {
        ok: true,
        value: { kind: 'safe_test', run_id: 'r9', run_status: 'queued', error: null }
      },
      'GET tasks': { ok: true, value: [TASK] }
    });
    const model = new TasksModel(api, 'c1');
    await model.refresh();
    await model.run('t1', 'test');
    assert.deepEqual(calls[1].body, { mode: 'test' });
    assert.equal(model.getSnapshot().lastRun.t1.runId, 'r9');
    await model.setPaused(model.getSnapshot().tasks[0], true);
    assert.deepEqual(calls[2].body, { status: 'paused', version: 3 });
    assert.equal(model.getSnapshot().message, 'nope'); // the PATCH failed: said, not hidden
    model.dismiss();
    assert.equal(model.getSnapshot().message, null);
  });

  it('says a cadence the way a member would', () => {
    assert.equal(cadenceLabel({ intervalSeconds: 86400, status: 'active' }), 'daily');
    assert.equal(cadenceLabel({ intervalSeconds: null, status: 'active' }), 'by hand');
    assert.equal(cadenceLabel({ intervalSeconds: 7200, status: 'active' }), 'every 2 h');
    assert.equal(cadenceLabel({ intervalSeconds: 86400, status: 'paused' }), 'paused');
  });
});
