/**
 * "Save to Jupyter folder…" for the shown artifact version: a path (proposed next to the
 * current notebook) written by the server through its ContentsManager. An existing file is
 * never replaced unless the member chooses "Overwrite" after being told it is there.
 */
import React, { useContext, useState } from 'react';

import { KaizenApi } from '../api';
import { IArtifactView } from '../artifacts';
import { FILE_EXISTS_STATUS, saveToJupyter, suggestedPath } from '../jupyterFiles';
import { JupyterHostContext } from '../jupyterHost';

type Phase =
  | { kind: 'closed' }
  | { kind: 'editing'; path: string; exists: boolean; message: string | null }
  | { kind: 'saving'; path: string }
  | { kind: 'saved'; path: string };

export function SaveToJupyter({ api, artifact }: { api: KaizenApi; artifact: IArtifactView }): JSX.Element {
  const host = useContext(JupyterHostContext);
  const [phase, setPhase] = useState<Phase>({ kind: 'closed' });

  const save = async (path: string, overwrite: boolean): Promise<void> => {
    setPhase({ kind: 'saving', path });
    const result = await saveToJupyter(api, artifact.id, artifact.version, path.trim(), overwrite);
    if (result.ok) {
      setPhase({ kind: 'saved', path: result.value.path });
      return;
    }
    setPhase({ kind: 'editing', path, exists: result.status === FILE_EXISTS_STATUS, message: result.message });
  };

  if (phase.kind === 'closed' || phase.kind === 'saved') {
    return (
      <span className="jp-Kaizen-saveToJupyter">
        <button
          type="button"
          className="jp-Kaizen-saveToJupyterButton"
          title="Write this version into the Jupyter file browser's folders"
          onClick={() =>
            setPhase({
              kind: 'editing',
              path: suggestedPath(host.currentFolder(), artifact),
              exists: false,
              message: null
            })
          }
        >
          Save to Jupyter folder…
        </button>
        {phase.kind === 'saved' && (
          <span className="jp-Kaizen-saved" role="status" data-path={phase.path}>
            Saved to {phase.path}
          </span>
        )}
      </span>
    );
  }
  const path = phase.path;
  const busy = phase.kind === 'saving';
  return (
    <form
      className="jp-Kaizen-saveForm"
      aria-label="Save to the Jupyter folder"
      onSubmit={event => {
        event.preventDefault();
        void save(path, false);
      }}
    >
      <label>
        Path in the Jupyter folder{' '}
        <input
          type="text"
          value={path}
          disabled={busy}
          autoFocus
          onChange={event =>
            setPhase({ kind: 'editing', path: event.target.value, exists: false, message: null })
          }
        />
      </label>
      <button type="submit" className="jp-Button jp-mod-styled jp-mod-accept" disabled={busy || !path.trim()}>
        {busy ? 'Saving…' : 'Save'}
      </button>
      {phase.kind === 'editing' && phase.exists && (
        <button
          type="button"
          className="jp-Button jp-mod-styled jp-mod-warn jp-Kaizen-overwrite"
          onClick={() => void save(path, true)}
        >
          Overwrite
        </button>
      )}
      <button
        type="button"
        className="jp-Button jp-mod-styled jp-Kaizen-secondary"
        disabled={busy}
        onClick={() => setPhase({ kind: 'closed' })}
      >
        Cancel
      </button>
      {phase.kind === 'editing' && phase.message && (
        <p className="jp-Kaizen-error" role="alert">
          {phase.message}
        </p>
      )}
    </form>
  );
}
