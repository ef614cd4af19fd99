import assert from 'node:assert/strict';
import { describe, it } from 'node:test';

import {
  askMessage,
  askTitle,
  cellReference,
  DEFAULT_QUESTION,
  fenceFor,
  ICellContext,
  quotedPart,
  selectionLines
} from '../src/ask';

const source = 'import math\nx = math.pi\nprint(x)\n';

function cell(extra: Partial<ICellContext> = {}): ICellContext {
  return {
    path: 'work/analysis.ipynb',
    index: 2,
    id: 'a1b2c3',
    cellType: 'code',
    language: 'python',
    source,
    selection: null,
    ...extra
  };
}

describe('ask about a cell', () => {
  it('quotes the whole cell with a reference to the notebook path, cell index and id', () => {
    const text = askMessage('What does this do?', cell());
    assert.equal(
      text,
      'What does this do?\n\nFrom notebook `work/analysis.ipynb`, cell 2, id `a1b2c3`:\n\n' +
        '```python\nimport math\nx = math.pi\nprint(x)\n```'
    );
  });

  it('quotes only the selection, with its lines', () => {
    const start = source.indexOf('x = ');
    const end = source.indexOf('print');
    const context = cell({ selection: { start, end } });
    assert.deepEqual(quotedPart(context), { text: 'x = math.pi\n', selected: true, lines: { from: 2, to: 2 } });
    assert.match(cellReference(context), /cell 2, id `a1b2c3`, selection on line 2$/);
    const text = askMessage('', context);
    assert.ok(text.startsWith(`${DEFAULT_QUESTION}\n\n`));
    assert.ok(text.endsWith('```python\nx = math.pi\n```'));
    // A backwards selection is the same selection.
    const reversed = cell({ selection: { start: source.length, end: 0 } });
    assert.match(cellReference(reversed), /selection of lines 1–3$/);
  });

  it('falls back to the whole cell for an empty or blank selection', () => {
    assert.equal(quotedPart(cell({ selection: { start: 3, end: 3 } })).selected, false);
    const blank = cell({ source: 'a\n\n\nb', selection: { start: 2, end: 3 } });
    assert.equal(quotedPart(blank).selected, false);
  });

  it('computes selection lines', () => {
    assert.deepEqual(selectionLines('a\nb\nc', 0, 1), { from: 1, to: 1 });
    assert.deepEqual(selectionLines('a\nb\nc', 2, 5), { from: 2, to: 3 });
    assert.deepEqual(selectionLines('a\nb\nc', 0, 2), { from: 1, to: 1 }); // ends at a line start
    assert.deepEqual(selectionLines('a\nb', 0, 99), { from: 1, to: 2 });
  });

  it('uses a fence longer than any backtick run in the code', () => {
    assert.equal(fenceFor('plain'), '```');
    assert.equal(fenceFor('x = "```"'), '````');
    const md = cell({ cellType: 'markdown', source: 'Some `code` and\n```\nblock\n```' });
    const text = askMessage('Proofread', md);
    assert.match(text, /cell 2 \(markdown\), id/);
    assert.ok(text.includes('````markdown\nSome `code`'));
    assert.ok(text.endsWith('\n````'));
  });

  it('bounds a huge cell and says how much was left out', () => {
    const big = cell({ source: 'y'.repeat(150), id: '' });
    const text = askMessage('q', big, 100);
    assert.ok(text.includes(`\n${'y'.repeat(100)}\n\`\`\``));
    assert.ok(text.endsWith('(50 more characters of the cell were not sent.)'));
    assert.ok(!text.includes('id `'));
  });

  it('titles a new conversation after the notebook and cell', () => {
    assert.equal(askTitle(cell()), 'About analysis.ipynb, cell 2');
  });
});
