/**
 * A tool call paused for a credential (`credential.requested`): the destination origin first,
 * then an "Enter credential" link that opens the signed form in a new tab — the value is typed
 * there, straight to the server, and never passes through the panel or the model — and
 * "Cancel" to decline. Resolves live for every viewer from `credential.settled`.
 */
import React, { useState } from 'react';

import { ICredentialRequestView } from '../journal';

export interface ICredentialCardProps {
  request: ICredentialRequestView;
  /** Whether the viewer may enter it (the run's initiating member). */
  canEnter: boolean;
  /** The form's URL on this server, or null when the path is not a form's. */
  formUrl: string | null;
  onCancel: (requestId: string) => Promise<void>;
}

const SETTLED_TEXT: Record<string, string> = {
  submitted: 'Credential entered; the call continues with it once.',
  cancelled: 'Cancelled; the call was not run.',
  expired: 'The form expired; the call was not run.'
};

export function CredentialCard(props: ICredentialCardProps): JSX.Element {
  const { request, canEnter, formUrl, onCancel } = props;
  const [busy, setBusy] = useState(false);
  const settled = request.status !== undefined;
  const headingId = `kaizen-credential-${request.requestId}`;
  const expires = request.expiresAt ? new Date(request.expiresAt) : null;
  return (
    <section
      className={`jp-Kaizen-approval jp-Kaizen-credential${settled ? ' jp-Kaizen-approval-decided' : ''}`}
      aria-labelledby={headingId}
      data-credential-request-id={request.requestId}
      data-status={request.status ?? 'pending'}
    >
      <div className="jp-Kaizen-approvalHead">
        <span id={headingId} className="jp-Kaizen-approvalTitle">
          Credential required
        </span>
        {request.effect && (
          <span className="jp-Kaizen-badge jp-Kaizen-capability">{request.effect}</span>
        )}
      </div>
      <p className="jp-Kaizen-credentialTo">
        Sent only to <code className="jp-Kaizen-credentialOrigin">{request.origin}</code>
      </p>
      <p className="jp-Kaizen-muted">
        For one call of <code>{request.tool}</code>
        {request.approvalId ? ', as you approved it' : ''}. The assistant never sees what you
        enter.
      </p>
      {settled ? (
        <p className="jp-Kaizen-decision" data-decision={request.status}>
          {SETTLED_TEXT[request.status ?? ''] ?? 'Settled.'}
        </p>
      ) : canEnter ? (
        <div className="jp-Kaizen-actions">
          {formUrl && (
            <a
              className="jp-Button jp-mod-styled jp-mod-accept jp-Kaizen-enterCredential"
              href={formUrl}
              target="_blank"
              rel="noopener noreferrer"
              referrerPolicy="no-referrer"
            >
              Enter credential
            </a>
          )}
          <button
            type="button"
            className="jp-Button jp-mod-styled jp-mod-reject"
            disabled={busy}
            onClick={() => {
              setBusy(true);
              void onCancel(request.requestId).finally(() => setBusy(false));
            }}
          >
            Cancel
          </button>
          {expires && !Number.isNaN(expires.getTime()) && (
            <span className="jp-Kaizen-muted">
              Until {expires.toLocaleTimeString()}
            </span>
          )}
        </div>
      ) : (
        <p className="jp-Kaizen-muted">Waiting for the member who asked to enter it.</p>
      )}
    </section>
  );
}
