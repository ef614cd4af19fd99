/**
 * The composer's attached Jupyter files (chips with a remove button), and the `@path`
 * completion list: while the caret is in an `@…` token, the matching entries of that folder of
 * the Jupyter tree; arrow keys move, Enter or Tab takes one (a folder continues the path, a file
 * is attached at once), Escape closes.
 */
import React, { useEffect, useRef, useState } from 'react';

import {
  IAttachment,
  IFolderEntry,
  matchingEntries,
  pathQuery,
  shortSize,
  splitQuery
} from '../jupyterFiles';

export function AttachmentChips({
  attachments,
  attaching,
  onDetach
}: {
  attachments: readonly IAttachment[];
  attaching: boolean;
  onDetach: (artifactId: string) => void;
}): JSX.Element | null {
  if (!attachments.length && !attaching) {
    return null;
  }
  return (
    <ul className="jp-Kaizen-attachments" aria-label="Files attached to the next message">
      {attachments.map(a => (
        <li key={a.artifactId} className="jp-Kaizen-attachment" data-path={a.path}
            title={`${a.path} (version ${a.version}), read-only for run_code as ${a.filename}`}>
          <span className="jp-Kaizen-attachmentName">{a.filename}</span>
          <span className="jp-Kaizen-attachmentMeta">{shortSize(a.size)}</span>
          <button
            type="button"
            className="jp-Kaizen-iconButton"
            aria-label={`Remove ${a.filename}`}
            onClick={() => onDetach(a.artifactId)}
          >
            ×
          </button>
        </li>
      ))}
      {attaching && (
        <li className="jp-Kaizen-attachment jp-Kaizen-attaching" role="status">
          Reading the file…
        </li>
      )}
    </ul>
  );
}

export type FolderLister = (folder: string) => Promise<IFolderEntry[]>;

export interface IPathCompletion {
  /** The entries offered now (empty: closed). */
  options: IFolderEntry[];
  active: number;
  /** Keyboard handling for the textarea; true when the key was the completion's. */
  onKeyDown: (event: React.KeyboardEvent<HTMLTextAreaElement>) => boolean;
  /** Take option `index`. */
  pick: (index: number) => void;
}

/**
 * `@path` completion over `text` at the textarea's caret. `setText` replaces the text (and
 * the caret follows); `onFile` is told of a file taken from the list.
 */
export function usePathCompletion(
  text: string,
  area: React.RefObject<HTMLTextAreaElement>,
  setText: (text: string) => void,
  list: FolderLister | undefined,
  onFile: ((path: string) => void) | undefined
): IPathCompletion {
  const [options, setOptions] = useState<IFolderEntry[]>([]);
  const [active, setActive] = useState(0);
  const [closedAt, setClosedAt] = useState<string | null>(null);
  const cache = useRef(new Map<string, IFolderEntry[]>());
  const caret = area.current?.selectionStart ?? text.length;
  const query = list ? pathQuery(text, caret) : null;

  useEffect(() => {
    if (!list || !query || closedAt === text) {
      setOptions([]);
      return;
    }
    const { folder, prefix } = splitQuery(query.query);
    let cancelled = false;
    const show = (entries: IFolderEntry[]): void => {
      if (!cancelled) {
        setOptions(matchingEntries(entries, prefix));
        setActive(0);
      }
    };
    const known = cache.current.get(folder);
    if (known) {
      show(known);
    } else {
      const timer = setTimeout(() => {
        void list(folder).then(entries => {
          cache.current.set(folder, entries);
          show(entries);
        });
      }, 120);
      return () => {
        cancelled = true;
        clearTimeout(timer);
      };
    }
    return () => {
      cancelled = true;
    };
  }, [list, query?.start, query?.query, closedAt, text]);

  const pick = (index: number): void => {
    const entry = options[index];
    if (!entry || !query) {
      return;
    }
    const end = query.start + 1 + query.query.length;
    const insert = `@${entry.path}${entry.directory ? '/' : ' '}`;
    const next = text.slice(0, query.start) + insert + text.slice(end);
    setText(next);
    setOptions([]);
    if (!entry.directory) {
      onFile?.(entry.path);
    }
    const at = query.start + insert.length;
    requestAnimationFrame(() => {
      area.current?.focus();
      area.current?.setSelectionRange(at, at);
    });
  };

  const onKeyDown = (event: React.KeyboardEvent<HTMLTextAreaElement>): boolean => {
    if (!options.length) {
      return false;
    }
    if (event.key === 'ArrowDown' || event.key === 'ArrowUp') {
      event.preventDefault();
      const step = event.key === 'ArrowDown' ? 1 : options.length - 1;
      setActive(i => (i + step) % options.length);
      return true;
    }
    if (event.key === 'Enter' || event.key === 'Tab') {
      event.preventDefault();
      pick(active);
      return true;
    }
    if (event.key === 'Escape') {
      event.preventDefault();
      setClosedAt(text);
      setOptions([]);
      return true;
    }
    return false;
  };
  return { options, active, onKeyDown, pick };
}

export function PathOptions({
  completion,
  listId
}: {
  completion: IPathCompletion;
  listId: string;
}): JSX.Element | null {
  if (!completion.options.length) {
    return null;
  }
  return (
    <ul id={listId} className="jp-Kaizen-pathOptions" role="listbox" aria-label="Jupyter files">
      {completion.options.map((entry, index) => (
        <li
          key={entry.path}
          id={`${listId}-${index}`}
          role="option"
          aria-selected={index === completion.active}
          className="jp-Kaizen-pathOption"
          data-path={entry.path}
          onMouseDown={event => {
            event.preventDefault(); // keep the textarea's focus
            completion.pick(index);
          }}
        >
          {entry.name}
          {entry.directory ? '/' : ''}
        </li>
      ))}
    </ul>
  );
}
