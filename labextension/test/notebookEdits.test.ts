import assert from 'node:assert/strict';
import { describe, it } from 'node:test';

import { applyFrames, initialState } from '../src/journal';
import { applicability, lineDiff } from '../src/notebook/edits';
import { Frame } from '../src/protocol';

function event(seq: number, type: string, data: Record<string, unknown>, runId = 'r1'): Frame {
  return { seq, conversation_id: 'c1', run_id: runId, type, actor: 'alice', at: '', data, live: false } as Frame;
}

const proposed = event(1, 'notebook.edit.proposed', {
  id: 'p1',
  member: 'alice',
  path: 'a.ipynb',
  cells: [
    { ordinal: 0, op: 'replace', cell_id: 'c', cell_type: 'code', base_source: 'x = 1', source: 'x = 2' },
    { ordinal: 1, op: 'insert', cell_id: 'n', after_cell_id: 'c', cell_type: 'code', source: 'print(x)' },
    { ordinal: 2, op: 'bogus', cell_id: 'z' }
  ]
});

describe('notebook edit proposals in the journal', () => {
  it('folds proposal, decision and result events per run and cell', () => {
    const state = applyFrames(initialState('c1'), [
      event(0.5, 'notebook.attached', { path: 'a.ipynb' }),
      proposed,
      event(2, 'notebook.edit.decided', { proposal_id: 'p1', ordinal: 1, decision: 'accepted', run_after: true }),
      event(3, 'notebook.edit.result', { proposal_id: 'p1', ordinal: 1, outcome: 'applied' }),
      event(4, 'notebook.kernel_access', { member: 'alice', allowed: true }, '')
    ]);
    const proposal = state.notebook.proposals.p1;
    assert.deepEqual(state.notebook.byRun.r1, ['p1']);
    assert.equal(proposal.cells.length, 2);
    assert.equal(proposal.cells[0].decision, 'pending');
    assert.deepEqual([proposal.cells[1].decision, proposal.cells[1].runAfter, proposal.cells[1].outcome], ['accepted', true, 'applied']);
    assert.deepEqual(state.notebook.attached, ['a.ipynb']);
    assert.deepEqual(state.notebook.kernelAccess, ['alice']);
    const revoked = applyFrames(state, [event(5, 'notebook.kernel_access', { member: 'alice', allowed: false }, '')]);
    assert.deepEqual(revoked.notebook.kernelAccess, []);
  });

  it('applies a cell only to the notebook as the model read it', () => {
    const cells = applyFrames(initialState('c1'), [proposed]).notebook.proposals.p1.cells;
    assert.deepEqual(applicability(cells[0], [{ id: 'c', source: 'x = 1' }]), { ok: true, index: 0 });
    assert.equal(applicability(cells[0], [{ id: 'c', source: 'x = 1 # edited' }]).ok, false);
    assert.equal(applicability(cells[0], []).ok, false);
    assert.deepEqual(applicability(cells[1], [{ id: 'a', source: '' }, { id: 'c', source: '' }]), { ok: true, index: 2 });
    assert.equal(applicability(cells[1], [{ id: 'n', source: '' }, { id: 'c', source: '' }]).ok, false);
  });

  it('diffs lines', () => {
    assert.deepEqual(lineDiff('a\nb\nc', 'a\nc\nd'), [
      { kind: 'same', text: 'a' },
      { kind: 'removed', text: 'b' },
      { kind: 'same', text: 'c' },
      { kind: 'added', text: 'd' }
    ]);
    assert.deepEqual(lineDiff('', 'x'), [{ kind: 'added', text: 'x' }]);
  });
});
