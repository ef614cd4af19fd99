/**
 * The preview of one artifact version, by `previewMode` (artifacts.ts): the governed path
 * first, and the sandboxed frame only for ordinary html and svg.
 */
import { IRenderMimeRegistry } from '@jupyterlab/rendermime';
import React from 'react';

import { IArtifactView, previewMode } from '../artifacts';
import { GovernedArtifactView } from './GovernedArtifactView';
import { Markdown } from './Markdown';
import { SandboxedFrame } from './SandboxedFrame';

export function ArtifactPreview({
  artifact,
  rendermime
}: {
  artifact: IArtifactView;
  rendermime: IRenderMimeRegistry;
}): JSX.Element {
  const mode = previewMode(artifact);
  const text = artifact.content ?? '';
  switch (mode) {
    case 'governed':
      return <GovernedArtifactView artifact={artifact} />;
    case 'markdown':
      return <Markdown text={text} rendermime={rendermime} streaming={false} />;
    case 'frame':
      return <SandboxedFrame artifact={artifact} />;
    case 'canvas-source':
      return (
        <>
          <p className="jp-Kaizen-status jp-Kaizen-canvasNote">
            Live canvas ({artifact.kind}): not run in the panel. Its source is shown as text.
          </p>
          <pre className="jp-Kaizen-artifactText">{text}</pre>
        </>
      );
    case 'text':
      return <pre className="jp-Kaizen-artifactText">{text}</pre>;
    default:
      return (
        <p className="jp-Kaizen-status jp-Kaizen-downloadOnly">
          No preview for this kind of file. Use Download to open it.
        </p>
      );
  }
}
