/**
 * The chat canvas of one tool call, shown under it in the transcript: Markdown
 * through the sanitizing renderer answers use, PNG images as `<img>` from a checked `data:`
 * URI, and a note where a canvas was dropped. What may be shown is decided by `callCanvas()`
 * (src/canvas.ts), a pure function.
 */
import { IRenderMimeRegistry } from '@jupyterlab/rendermime';
import React, { useMemo } from 'react';

import { callCanvas, CANVAS_DROPPED_TEXT } from '../canvas';
import { IToolCallView } from '../journal';
import { Markdown } from './Markdown';

export function ChatCanvas({
  call,
  rendermime
}: {
  call: IToolCallView;
  rendermime: IRenderMimeRegistry;
}): JSX.Element | null {
  const { callId, canvas: items, canvasDropped } = call;
  const canvas = useMemo(
    () => callCanvas({ callId, canvas: items, canvasDropped }),
    [callId, items, canvasDropped]
  );
  if (!canvas.entries.length && !canvas.dropped) {
    return null;
  }
  return (
    <div className="jp-Kaizen-canvas" role="group" aria-label={`Shown by ${call.name}`}>
      {canvas.entries.map(entry =>
        entry.kind === 'markdown' ? (
          <section key={entry.key} className="jp-Kaizen-canvasMarkdown">
            {entry.title && <h4 className="jp-Kaizen-canvasTitle">{entry.title}</h4>}
            {/* Untrusted rendering: model-authored HTML is sanitized, never executed. */}
            <Markdown text={entry.markdown} rendermime={rendermime} streaming={false} />
          </section>
        ) : (
          <img
            key={entry.key}
            className="jp-Kaizen-canvasImage"
            src={entry.src}
            alt={entry.alt}
            width={entry.width ?? undefined}
            height={entry.height ?? undefined}
            loading="lazy"
          />
        )
      )}
      {canvas.dropped && <p className="jp-Kaizen-muted jp-Kaizen-canvasDropped">{CANVAS_DROPPED_TEXT}</p>}
    </div>
  );
}
