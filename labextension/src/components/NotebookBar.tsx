/**
 * Above the composer: the notebooks attached to each message here (× to stop attaching
 * one), and, once a notebook was attached in this conversation, whether Kaizen may inspect
 * its kernel: the member's own permission, stored on the server, allowed or revoked here.
 */
import React, { useContext, useEffect, useState, useSyncExternalStore } from 'react';

import { kernelAccess } from '../notebook/api';
import { NotebookAttachments } from '../notebook/attachments';
import { NotebookToolsContext } from '../notebook/context';

export function NotebookBar({
  conversationId,
  attachments,
  attachedHere,
  allowedBy,
  me
}: {
  conversationId: string;
  attachments: NotebookAttachments;
  /** Notebooks attached in this conversation so far (journal). */
  attachedHere: readonly string[];
  /** Members who allowed kernel access here (journal). */
  allowedBy: readonly string[];
  me: string | null;
}): JSX.Element | null {
  const { api } = useContext(NotebookToolsContext);
  const paths = useSyncExternalStore(attachments.subscribe, attachments.getSnapshot);
  const [error, setError] = useState<string | null>(null);
  const [busy, setBusy] = useState(false);
  const allowed = me !== null && allowedBy.includes(me);
  useEffect(() => setError(null), [allowed]);
  if (!paths.length && !attachedHere.length) {
    return null;
  }
  const toggle = async (): Promise<void> => {
    if (!api) {
      return;
    }
    setBusy(true);
    const result = await kernelAccess(api, conversationId, allowed ? 'DELETE' : 'PUT');
    setError(result.ok ? null : result.message);
    setBusy(false);
  };
  return (
    <div className="jp-Kaizen-notebookBar">
      {paths.map(path => (
        <span key={path} className="jp-Kaizen-chip" title={`Attached to each message: ${path}`}>
          {path.split('/').pop()}
          <button
            type="button"
            className="jp-Kaizen-iconButton"
            aria-label={`Stop attaching ${path}`}
            onClick={() => attachments.remove(path)}
          >
            ×
          </button>
        </span>
      ))}
      <label
        className="jp-Kaizen-kernelAccess"
        title="Let Kaizen run its fixed, read-only inspection in the kernels of notebooks you attach here: variable names, types, shapes, DataFrame columns and first rows"
      >
        <input type="checkbox" checked={allowed} disabled={busy || !api} onChange={() => void toggle()} />{' '}
        Kaizen may inspect the notebook&apos;s kernel
      </label>
      {error && (
        <span className="jp-Kaizen-error" role="alert">
          {error}
        </span>
      )}
    </div>
  );
}
