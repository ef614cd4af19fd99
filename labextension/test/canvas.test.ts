/**
 * the chat canvas of a tool call in the panel. The journal reducer keeps the
 * `canvas` (and `canvas_dropped`) of `tool.settled`; `callCanvas()` decides what reaches the
 * DOM: Markdown for the sanitizing renderer, PNG images as `data:image/png;base64,` URIs built
 * only from checked base64, and a note where the canvas was dropped.
 */
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';

import {
  CANVAS_DROPPED_TEXT,
  callCanvas,
  DEFAULT_IMAGE_ALT,
  MAX_CANVAS_IMAGE_CHARS,
  MAX_CANVAS_ITEMS,
  MAX_CANVAS_MARKDOWN_CHARS,
  pngDataUri
} from '../src/canvas';
import { applyFrames, initialState } from '../src/journal';
import { CONV, ev } from './helpers';

// A 1×1 PNG.
const PNG =
  'iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==';
const IMAGE = { kind: 'image', media_type: 'image/png', data: PNG, alt: 'Image 1 of 1', width: 1, height: 1 };
const MARKDOWN = { kind: 'markdown', title: 'Totals', markdown: '| a | b |\n| - | - |\n| 1 | 2 |' };

function settledWith(data: Record<string, unknown>) {
  return applyFrames(initialState(CONV), [
    ev(1, 'input.accepted', { input_id: 'i1', position: 1, text: 'draw' }),
    ev(2, 'run.admitted', { model: 'fake-model' }),
    ev(3, 'tool.requested', { step: 1, call_id: 'c1', name: 'run_code' }),
    ev(4, 'tool.settled', { step: 1, call_id: 'c1', name: 'run_code', outcome: 'ok', content: '{}', ...data })
  ]).runs.r1.tools[0];
}

describe('chat canvas (R-277, R-278)', () => {
  it('R-277: keeps the journaled canvas on the settled call and shows Markdown and PNG images', () => {
    const call = settledWith({ canvas: [MARKDOWN, IMAGE] });
    const canvas = callCanvas(call);
    assert.equal(canvas.dropped, false);
    assert.deepEqual(canvas.entries, [
      { kind: 'markdown', key: 'c1-canvas-0', title: 'Totals', markdown: MARKDOWN.markdown },
      {
        kind: 'image',
        key: 'c1-canvas-1',
        src: `data:image/png;base64,${PNG}`,
        alt: 'Image 1 of 1',
        width: 1,
        height: 1
      }
    ]);
  });

  it('R-277: a call without a canvas shows nothing', () => {
    const canvas = callCanvas(settledWith({}));
    assert.deepEqual(canvas, { entries: [], dropped: false });
  });

  it('R-278: a dropped canvas shows the note and no content', () => {
    const call = settledWith({ canvas_dropped: true });
    assert.equal(call.canvasDropped, true);
    assert.deepEqual(callCanvas(call), { entries: [], dropped: true });
    assert.match(CANVAS_DROPPED_TEXT, /nothing was rendered/);
  });

  it('builds an image source only as a PNG data: URI from checked base64', () => {
    assert.equal(pngDataUri('image/png', PNG), `data:image/png;base64,${PNG}`);
    const refused: Array<[unknown, unknown]> = [
      ['image/svg+xml', PNG], // another type
      ['image/png', 'R0lGODlhAQABAAAAACw='], // a GIF
      ['image/png', `${PNG.slice(0, -4)}"><x`], // would leave the attribute
      ['image/png', `${PNG}#javascript:alert(1)`], // not base64
      ['image/png', PNG.slice(0, -1)], // not a whole base64 text
      ['image/png', `iVBORw0KGgo${'A'.repeat(MAX_CANVAS_IMAGE_CHARS)}`], // over the bound
      ['image/png', 42],
      ['text/html', 'javascript:alert(1)']
    ];
    for (const [type, data] of refused) {
      assert.equal(pngDataUri(type, data), null, `${String(type)} ${String(data).slice(0, 40)}`);
    }
  });

  it('leaves out items that fail a check and keeps the rest', () => {
    const canvas = callCanvas({
      callId: 'c9',
      canvas: [
        { ...IMAGE, data: 'not base64' },
        { kind: 'markdown', markdown: 'x'.repeat(MAX_CANVAS_MARKDOWN_CHARS + 1) },
        { kind: 'markdown', markdown: '   ' },
        { kind: 'html', html: '<script>alert(1)</script>' },
        'a string',
        { ...IMAGE, alt: '', width: -3, height: 1e9 }
      ]
    });
    assert.deepEqual(canvas.entries, [
      {
        kind: 'image',
        key: 'c9-canvas-5',
        src: `data:image/png;base64,${PNG}`,
        alt: DEFAULT_IMAGE_ALT,
        width: null,
        height: null
      }
    ]);
  });

  it('shows at most the bounded number of items', () => {
    const canvas = callCanvas({ callId: 'c2', canvas: Array(MAX_CANVAS_ITEMS + 3).fill(MARKDOWN) });
    assert.equal(canvas.entries.length, MAX_CANVAS_ITEMS);
  });
});
