/**
 * An approval request: tool, capability, arguments as readable key/value lines, the
 * arguments digest, and Approve / Deny for the member who may decide — plus "Allow for this
 * conversation" for a write tool (a sensitive one asks every time). Resolves live for every
 * viewer from the `approval.decided` event.
 */
import React, { useState } from 'react';

import { argumentLines, IApprovalView } from '../journal';
import { Decision } from '../model';

/** Only a write tool can be allowed for the rest of a conversation (the server's rule too). */
export function canAllowForConversation(approval: IApprovalView): boolean {
  return approval.capability === 'write';
}

export interface IApprovalCardProps {
  approval: IApprovalView;
  /** Whether the viewer may decide (the run's initiating member). */
  canDecide: boolean;
  owner: string;
  onDecide: (approvalId: string, decision: Decision) => Promise<void>;
}

export function ApprovalCard(props: IApprovalCardProps): JSX.Element {
  const { approval, canDecide, owner, onDecide } = props;
  const [busy, setBusy] = useState(false);
  const lines = argumentLines(approval.arguments);
  const decided = approval.decision !== undefined;
  const decide = (decision: Decision): void => {
    setBusy(true);
    void onDecide(approval.approvalId, decision).finally(() => setBusy(false));
  };
  const headingId = `kaizen-approval-${approval.approvalId}`;
  return (
    <section
      className={`jp-Kaizen-approval${decided ? ' jp-Kaizen-approval-decided' : ''}`}
      aria-labelledby={headingId}
      data-approval-id={approval.approvalId}
    >
      <div className="jp-Kaizen-approvalHead">
        <span id={headingId} className="jp-Kaizen-approvalTitle">
          Approve <code>{approval.tool}</code>?
        </span>
        {approval.capability && (
          <span className="jp-Kaizen-badge jp-Kaizen-capability">{approval.capability}</span>
        )}
      </div>
      {lines.length ? (
        <dl className="jp-Kaizen-args">
          {lines.map(([key, value]) => (
            <React.Fragment key={key}>
              <dt>{key}</dt>
              <dd>
                <pre className="jp-Kaizen-pre">{value}</pre>
              </dd>
            </React.Fragment>
          ))}
        </dl>
      ) : (
        <p className="jp-Kaizen-muted">No arguments.</p>
      )}
      {approval.argsDigest && (
        <p className="jp-Kaizen-digest" title="Digest of the exact arguments to be run">
          Digest <code>{approval.argsDigest.slice(0, 16)}</code>
        </p>
      )}
      {decided ? (
        <p className="jp-Kaizen-decision" data-decision={approval.decision}>
          {approval.decision === 'approved' ? 'Approved' : 'Denied'}
          {approval.scope === 'conversation' ? ' for this conversation' : ''}
          {approval.decidedBy ? ` by ${approval.decidedBy}` : ''}.
        </p>
      ) : canDecide ? (
        <div className="jp-Kaizen-actions">
          <button
            type="button"
            className="jp-Button jp-mod-styled jp-mod-accept"
            disabled={busy}
            onClick={() => decide('approve')}
          >
            Approve
          </button>
          {canAllowForConversation(approval) && (
            <button
              type="button"
              className="jp-Button jp-mod-styled jp-Kaizen-secondary jp-Kaizen-allowHere"
              disabled={busy}
              title={`Run ${approval.tool} without asking again in this conversation (you can revoke it)`}
              onClick={() => decide('allow_conversation')}
            >
              Allow for this conversation
            </button>
          )}
          <button
            type="button"
            className="jp-Button jp-mod-styled jp-mod-reject"
            disabled={busy}
            onClick={() => decide('deny')}
          >
            Deny
          </button>
        </div>
      ) : (
        <p className="jp-Kaizen-muted">Waiting for {owner || 'the member who asked'} to decide.</p>
      )}
    </section>
  );
}
