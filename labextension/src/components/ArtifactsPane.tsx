/**
 * The artifacts pane of a conversation: the files run_code calls are generating (placeholders
 * that become their durable files, R-236), the list (title, kind, owner, version), and the
 * selected artifact with a version picker, its preview and a Download button.
 */
import { IRenderMimeRegistry } from '@jupyterlab/rendermime';
import React, { useMemo, useSyncExternalStore } from 'react';

import { KaizenApi } from '../api';
import { formatSize, IArtifact, kindLabel } from '../artifacts';
import {
  ArtifactsModel,
  GenerationEntry,
  generationEntries,
  SaveFile,
  visibleGeneration
} from '../artifactsModel';
import { IConversationState } from '../journal';
import { ArtifactPreview } from './ArtifactPreview';
import { SaveToJupyter } from './SaveToJupyter';

export interface IArtifactsPaneProps {
  model: ArtifactsModel;
  /** The conversation's journal state: its generation placeholders come from it. */
  journal: IConversationState;
  rendermime: IRenderMimeRegistry;
  me: string | null;
  /** With it, the member's own artifacts can be saved into the Jupyter folder. */
  api?: KaizenApi;
}

export function ArtifactsPane({
  model,
  journal,
  rendermime,
  me,
  api
}: IArtifactsPaneProps): JSX.Element {
  const state = useSyncExternalStore(model.subscribe, model.getSnapshot);
  const { list, selectedId, view } = state;
  const artifacts = list.phase === 'ready' ? list.value : [];
  const shown = view?.phase === 'ready' ? view.value : null;
  const entries = useMemo(() => generationEntries(journal), [journal]);
  const generation = useMemo(() => visibleGeneration(entries, artifacts), [entries, artifacts]);

  return (
    <div className="jp-Kaizen-artifacts">
      <div className="jp-Kaizen-artifactsBar">
        <button
          type="button"
          className="jp-Kaizen-linkButton"
          onClick={() => void model.refresh()}
          aria-label="Refresh the artifacts"
        >
          Refresh
        </button>
      </div>
      {list.phase === 'loading' && <p className="jp-Kaizen-status">Loading the artifacts…</p>}
      {list.phase === 'error' && (
        <p className="jp-Kaizen-error" role="alert">
          {list.message}
        </p>
      )}
      {generation.length > 0 && (
        <ul className="jp-Kaizen-artifactList jp-Kaizen-generationList" aria-label="Generated files">
          {generation.map(entry => (
            <li key={entry.key}>
              <GenerationItem
                entry={entry}
                downloading={state.downloading}
                onDownload={(artifactId, version) =>
                  void model.downloadVersion(artifactId, version, saveFile)
                }
              />
            </li>
          ))}
        </ul>
      )}
      {generation.length > 0 && !shown && state.message && (
        <p className="jp-Kaizen-error" role="alert">
          {state.message}
        </p>
      )}
      {list.phase === 'ready' && !artifacts.length && !generation.length && (
        <p className="jp-Kaizen-empty">No artifacts in this conversation yet.</p>
      )}
      {artifacts.length > 0 && (
        <ul className="jp-Kaizen-artifactList" aria-label="Artifacts of this conversation">
          {artifacts.map(artifact => (
            <li key={artifact.id}>
              <ArtifactItem
                artifact={artifact}
                selected={artifact.id === selectedId}
                me={me}
                onSelect={() => void model.select(artifact.id === selectedId ? null : artifact.id)}
              />
            </li>
          ))}
        </ul>
      )}
      {selectedId && (
        <section
          className="jp-Kaizen-artifactDetail"
          aria-label={shown ? `Artifact: ${shown.title}` : 'Artifact'}
          data-artifact-id={selectedId}
        >
          {view?.phase === 'loading' && <p className="jp-Kaizen-status">Opening the artifact…</p>}
          {view?.phase === 'error' && (
            <p className="jp-Kaizen-error" role="alert">
              {view.message}
            </p>
          )}
          {shown && (
            <>
              <div className="jp-Kaizen-artifactHead">
                <h3 className="jp-Kaizen-artifactTitle">{shown.title}</h3>
                <label className="jp-Kaizen-versionPicker">
                  Version{' '}
                  <select
                    value={shown.version}
                    onChange={event => {
                      const picked = Number(event.currentTarget.value);
                      void model.pickVersion(
                        picked === shown.versions[shown.versions.length - 1] ? null : picked
                      );
                    }}
                  >
                    {shown.versions.map(v => (
                      <option key={v} value={v}>
                        {v}
                        {v === shown.latestVersion ? ' (latest)' : ''}
                      </option>
                    ))}
                  </select>
                </label>
                <button
                  type="button"
                  className="jp-Kaizen-download"
                  disabled={state.downloading}
                  onClick={() => void model.download(saveFile)}
                >
                  {state.downloading ? 'Downloading…' : 'Download'}
                </button>
                {api && shown.owner === me && (
                  <SaveToJupyter key={`${shown.id}-${shown.version}`} api={api} artifact={shown} />
                )}
              </div>
              <p className="jp-Kaizen-artifactMeta">
                {kindLabel(shown)} · {formatSize(shown.size)} · by{' '}
                {shown.owner === me ? 'you' : shown.owner}
              </p>
              {state.message && (
                <div className="jp-Kaizen-error" role="alert">
                  <span>{state.message}</span>
                  <button
                    type="button"
                    className="jp-Kaizen-iconButton"
                    aria-label="Dismiss"
                    onClick={() => model.dismiss()}
                  >
                    ×
                  </button>
                </div>
              )}
              <div
                className="jp-Kaizen-artifactPreview"
                data-kind={shown.kind}
                data-version={shown.version}
              >
                <ArtifactPreview artifact={shown} rendermime={rendermime} />
              </div>
            </>
          )}
        </section>
      )}
    </div>
  );
}

/**
 * One declared file of a run_code call: while the call runs, a placeholder with no way to
 * download it; once stored, that exact version with a Download button.
 */
function GenerationItem({
  entry,
  downloading,
  onDownload
}: {
  entry: GenerationEntry;
  downloading: boolean;
  onDownload: (artifactId: string, version: number) => void;
}): JSX.Element {
  if (entry.state === 'generating') {
    return (
      <div
        className="jp-Kaizen-artifactItem jp-Kaizen-generating"
        role="status"
        aria-busy="true"
        data-generation-target={entry.target}
      >
        <span className="jp-Kaizen-artifactItemTitle">Generating {entry.target}…</span>
        <span className="jp-Kaizen-artifactItemMeta">Not ready to download yet</span>
      </div>
    );
  }
  return (
    <div
      className="jp-Kaizen-artifactItem jp-Kaizen-generated"
      data-generation-target={entry.target}
      data-artifact-id={entry.artifactId}
      data-version={entry.version}
    >
      <span className="jp-Kaizen-artifactItemTitle">{entry.filename}</span>
      <span className="jp-Kaizen-artifactItemMeta">
        {entry.mediaType ? `${entry.mediaType} · ` : ''}v{entry.version} · ready
      </span>
      <button
        type="button"
        className="jp-Kaizen-download"
        disabled={downloading}
        aria-label={`Download ${entry.filename}`}
        onClick={() => onDownload(entry.artifactId, entry.version)}
      >
        Download
      </button>
    </div>
  );
}

function ArtifactItem({
  artifact,
  selected,
  me,
  onSelect
}: {
  artifact: IArtifact;
  selected: boolean;
  me: string | null;
  onSelect: () => void;
}): JSX.Element {
  const owner = artifact.owner === me ? 'you' : artifact.owner;
  return (
    <button
      type="button"
      className="jp-Kaizen-artifactItem"
      aria-pressed={selected}
      data-artifact-id={artifact.id}
      onClick={onSelect}
    >
      <span className="jp-Kaizen-artifactItemTitle">{artifact.title}</span>
      <span className="jp-Kaizen-artifactItemMeta">
        {kindLabel(artifact)} · v{artifact.latestVersion} · {owner}
      </span>
    </button>
  );
}

/** Hand the bytes to the browser as a file download (never opened in the page). */
export const saveFile: SaveFile = (blob, filename) => {
  const url = URL.createObjectURL(blob);
  const link = document.createElement('a');
  link.href = url;
  link.download = filename;
  link.rel = 'noopener';
  link.style.display = 'none';
  document.body.appendChild(link);
  link.click();
  link.remove();
  setTimeout(() => URL.revokeObjectURL(url), 30000);
};
