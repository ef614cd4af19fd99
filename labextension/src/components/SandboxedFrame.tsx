/**
 * The one frame of the panel: a preview of an ORDINARY html or svg artifact, sandboxed
 * without any permission (`sandbox=""`: no scripts, no same-origin, no forms, no popups, no
 * top navigation), its text given through `srcdoc` behind a no-network policy. Nothing is
 * ever injected into the panel's own DOM, and nothing talks to the frame (no messaging).
 *
 * Governed renderable artifacts never come here: the pane sends them to
 * `GovernedArtifactView`, and this component refuses them again itself, whatever its caller.
 */
import React from 'react';

import { FRAME_KINDS, frameDocument, IArtifactView, isGovernedArtifact } from '../artifacts';

export function SandboxedFrame({ artifact }: { artifact: IArtifactView }): JSX.Element {
  if (isGovernedArtifact(artifact) || !FRAME_KINDS.has(artifact.kind) || artifact.content === null) {
    return (
      <p className="jp-Kaizen-status" data-refused="frame">
        This artifact is not shown in a frame. Download it to open it.
      </p>
    );
  }
  return (
    <iframe
      className="jp-Kaizen-artifactFrame"
      title={`Preview of ${artifact.title} (scripts disabled)`}
      sandbox=""
      referrerPolicy="no-referrer"
      srcDoc={frameDocument(artifact.content)}
    />
  );
}
