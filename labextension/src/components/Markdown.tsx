/**
 * Markdown through JupyterLab's rendermime, untrusted: the sanitizer strips scripts, event
 * handlers and other active HTML, so model-authored HTML is never executed.
 *
 * No flicker: a new text is rendered off-screen and swapped in only once ready, so the
 * streamed text becomes the committed one in place. While streaming, renders are throttled.
 * Code blocks of a final answer get "Copy" and "Insert into notebook" buttons, and its
 * document citations become links that open the cited passage (documents.ts).
 */
import { IRenderMime, IRenderMimeRegistry, MimeModel } from '@jupyterlab/rendermime';
import { Widget } from '@lumino/widgets';
import React, { useContext, useEffect, useLayoutEffect, useRef } from 'react';

import { CitationContext, decorateCitations, linkCitations } from '../documents';

export interface ICodeActions {
  /** Insert code into the active notebook; resolves to a sentence for the member on failure. */
  insert: (code: string) => Promise<string | null>;
}

export interface IMarkdownProps {
  text: string;
  rendermime: IRenderMimeRegistry;
  streaming: boolean;
  codeActions?: ICodeActions;
}

const STREAM_RENDER_MS = 120;

export function Markdown(props: IMarkdownProps): JSX.Element {
  const { text, rendermime, streaming, codeActions } = props;
  const host = useRef<HTMLDivElement>(null);
  const shown = useRef<IRenderMime.IRenderer | null>(null);
  const version = useRef(0);
  const lastRender = useRef(0);
  const openCitation = useContext(CitationContext);

  useEffect(() => {
    const v = ++version.current;
    const render = (): void => {
      if (v !== version.current || !host.current) {
        return;
      }
      lastRender.current = Date.now();
      const renderer = rendermime.createRenderer('text/markdown');
      const model = new MimeModel({
        data: { 'text/markdown': linkCitations(text) },
        trusted: false
      });
      void renderer
        .renderModel(model)
        .catch(reason => {
          console.warn('Kaizen: markdown rendering failed', reason);
          renderer.node.textContent = text;
        })
        .then(() => {
          if (v !== version.current || !host.current) {
            renderer.dispose();
            return;
          }
          if (!streaming && codeActions) {
            decorateCodeBlocks(renderer.node, codeActions);
          }
          if (!streaming && openCitation) {
            decorateCitations(renderer.node, openCitation);
          }
          const previous = shown.current;
          Widget.attach(renderer, host.current);
          if (previous) {
            previous.dispose();
          }
          shown.current = renderer;
        });
    };
    if (streaming) {
      const wait = Math.max(0, STREAM_RENDER_MS - (Date.now() - lastRender.current));
      const timer = setTimeout(render, wait);
      return () => clearTimeout(timer);
    }
    render();
    return undefined;
  }, [text, streaming, rendermime, codeActions, openCitation]);

  // A layout-effect cleanup runs before React removes the host from the document, so the
  // renderer is detached while still attached (Lumino refuses to detach a removed node; a
  // transcript window that drops entries, or going back to the list, unmounts many of these).
  useLayoutEffect(
    () => () => {
      version.current++;
      const renderer = shown.current;
      shown.current = null;
      if (renderer) {
        try {
          renderer.dispose();
        } catch (reason) {
          console.warn('Kaizen: could not dispose a markdown rendering', reason);
        }
      }
    },
    []
  );

  return (
    <div
      ref={host}
      className={`jp-Kaizen-markdown${streaming ? ' jp-Kaizen-markdown-streaming' : ''}`}
    />
  );
}

/** Add a small toolbar over each `<pre>` block: Copy, Insert into notebook. */
export function decorateCodeBlocks(root: HTMLElement, actions: ICodeActions): void {
  const blocks = Array.from(root.querySelectorAll('pre'));
  for (const pre of blocks) {
    if (pre.parentElement?.classList.contains('jp-Kaizen-code')) {
      continue;
    }
    const wrapper = document.createElement('div');
    wrapper.className = 'jp-Kaizen-code';
    const bar = document.createElement('div');
    bar.className = 'jp-Kaizen-codeBar';
    const status = document.createElement('span');
    status.className = 'jp-Kaizen-codeStatus';
    status.setAttribute('role', 'status');
    const code = (): string => (pre.querySelector('code') ?? pre).textContent ?? '';

    const copy = button('Copy', 'Copy this code', () => {
      void copyText(code()).then(ok => {
        status.textContent = ok ? 'Copied.' : 'Copy failed: select the code and copy it.';
      });
    });
    const insert = button('Insert into notebook', 'Insert this code into a new cell below the active cell', () => {
      status.textContent = 'Inserting…';
      void actions.insert(code()).then(problem => {
        status.textContent = problem ?? 'Inserted.';
      });
    });
    bar.append(copy, insert, status);
    pre.replaceWith(wrapper);
    wrapper.append(bar, pre);
  }
}

function button(label: string, title: string, onClick: () => void): HTMLButtonElement {
  const el = document.createElement('button');
  el.type = 'button';
  el.className = 'jp-Kaizen-codeButton';
  el.textContent = label;
  el.title = title;
  el.addEventListener('click', onClick);
  return el;
}

async function copyText(text: string): Promise<boolean> {
  try {
    await navigator.clipboard.writeText(text);
    return true;
  } catch {
    // Not a secure context, or no permission: the old way.
    const area = document.createElement('textarea');
    area.value = text;
    area.setAttribute('readonly', '');
    area.style.position = 'fixed';
    area.style.opacity = '0';
    document.body.appendChild(area);
    area.select();
    let ok = false;
    try {
      ok = document.execCommand('copy');
    } catch {
      ok = false;
    }
    area.remove();
    return ok;
  }
}
