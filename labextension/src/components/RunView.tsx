/**
 * One run in the transcript: the member's input, the tool timeline, approval cards, the
 * answer (live while streaming, then committed in place) and how the run ended.
 */
import { IRenderMimeRegistry } from '@jupyterlab/rendermime';
import React from 'react';

import { IRunView, isTerminal, runUsage, usageSummary } from '../journal';
import { Decision } from '../model';
import { IProposalView } from '../notebook/edits';
import { ApprovalCard } from './ApprovalCard';
import { CredentialCard } from './CredentialCard';
import { Spinner } from './Elapsed';
import { ICodeActions, Markdown } from './Markdown';
import { NotebookProposalCard } from './NotebookProposalCard';
import { ToolTimeline } from './ToolTimeline';

export interface IRunProps {
  run: IRunView;
  me: string | null;
  rendermime: IRenderMimeRegistry;
  codeActions: ICodeActions;
  /** Agent ids to display names. */
  agentName?: (agentId: string) => string;
  onCancel: (runId: string) => void;
  onDecide: (approvalId: string, decision: Decision) => Promise<void>;
  /** This run's notebook edit proposals (journal), shown as review cards. */
  proposals?: readonly IProposalView[];
  /** The URL of a paused call's credential form, from its `form_path` (null: none). */
  credentialFormUrl?: (formPath: string) => string | null;
  /** Decline a paused call's credential. */
  onCancelCredential?: (requestId: string) => Promise<void>;
}

const TERMINAL_TEXT: Record<string, string> = {
  failed: 'The run failed.',
  answer_unavailable: 'No answer could be produced.',
  cancelled: 'Stopped.'
};

export function InputBubble({ run, me }: { run: IRunView; me: string | null }): JSX.Element | null {
  const input = run.input;
  if (!input) {
    return null;
  }
  const mine = me !== null && input.member === me;
  return (
    <div
      className={`jp-Kaizen-input${input.kind === 'steering' ? ' jp-Kaizen-input-steering' : ''}`}
      data-mine={mine ? 'true' : 'false'}
    >
      <div className="jp-Kaizen-author">
        {mine ? 'You' : input.member}
        {input.kind === 'steering' && <span className="jp-Kaizen-badge">steering</span>}
      </div>
      <div className="jp-Kaizen-inputText">{input.text}</div>
    </div>
  );
}

export const RunView = React.memo(function RunView(props: IRunProps): JSX.Element {
  const { run, me, rendermime, codeActions, agentName, onCancel, onDecide, proposals } = props;
  const { credentialFormUrl, onCancelCredential } = props;
  const waitingForCredential = (run.credentials ?? []).some(c => !c.status);
  const ended = isTerminal(run);
  const running = !ended && run.admitted;
  const answers = [...run.answers].sort((a, b) => a.step - b.step);
  const canDecide = me !== null && (run.input?.member ?? me) === me;
  const lastCommitted = [...answers].reverse().find(a => a.committed);
  return (
    <article
      className="jp-Kaizen-run"
      data-run-id={run.runId}
      data-status={run.status}
      aria-busy={running ? 'true' : 'false'}
    >
      <InputBubble run={run} me={me} />
      <ToolTimeline tools={run.tools} running={running} rendermime={rendermime} />
      {run.approvals.map(approval => (
        <ApprovalCard
          key={approval.approvalId}
          approval={approval}
          canDecide={canDecide}
          owner={run.input?.member ?? ''}
          onDecide={onDecide}
        />
      ))}
      {(run.credentials ?? []).map(request => (
        <CredentialCard
          key={request.requestId}
          request={request}
          canEnter={canDecide}
          formUrl={credentialFormUrl ? credentialFormUrl(request.formPath) : null}
          onCancel={onCancelCredential ?? (() => Promise.resolve())}
        />
      ))}
      {proposals?.map(proposal => (
        <NotebookProposalCard key={proposal.id} proposal={proposal} me={me} />
      ))}
      {answers.map(answer => (
        <div
          key={`answer-${answer.step}`}
          className="jp-Kaizen-answer"
          data-committed={answer.committed ? 'true' : 'false'}
        >
          <Markdown
            text={answer.text}
            rendermime={rendermime}
            streaming={!answer.committed}
            codeActions={codeActions}
          />
          {answer === lastCommitted && (
            <AnswerMeta run={run} model={answer.model} agentName={agentName} />
          )}
        </div>
      ))}
      {running && run.thinking ? <Thinking text={run.thinking} /> : null}
      {running && (
        <div className="jp-Kaizen-runStatus">
          <Spinner />
          <span>
            {run.status !== 'awaiting_approval'
              ? 'Working…'
              : waitingForCredential
                ? 'Waiting for a credential…'
                : 'Waiting for approval…'}
          </span>
          <button
            type="button"
            className="jp-Button jp-mod-styled jp-mod-warn jp-Kaizen-stop"
            onClick={() => onCancel(run.runId)}
            aria-label="Stop this run"
          >
            Stop
          </button>
        </div>
      )}
      {ended && run.terminal && run.terminal.status !== 'completed' && (
        <p className="jp-Kaizen-terminal" data-status={run.terminal.status}>
          {run.terminal.message || TERMINAL_TEXT[run.terminal.status] || 'The run ended.'}
        </p>
      )}
    </article>
  );
});

/**
 * Who produced an answer and what it cost: the model and agent (from `run.admitted` and
 * `answer.committed`), then the run's tokens (and cost when the provider reports it).
 */
export function AnswerMeta({
  run,
  model,
  agentName
}: {
  run: IRunView;
  model?: string;
  agentName?: (agentId: string) => string;
}): JSX.Element | null {
  const usage = runUsage(run);
  const shownModel = model || run.model;
  const agent = run.agentId ? (agentName ? agentName(run.agentId) : run.agentId) : '';
  const version = run.agentVersion !== undefined && run.agentVersion !== '' ? ` v${run.agentVersion}` : '';
  const summary = usage
    ? usageSummary({
        prompt: usage.prompt_tokens,
        completion: usage.completion_tokens,
        total: usage.total_tokens,
        cost: usage.cost
      })
    : '';
  if (!shownModel && !agent && !summary) {
    return null;
  }
  return (
    <div className="jp-Kaizen-answerMeta" data-tokens={usage?.total_tokens ?? ''}>
      {agent && (
        <span className="jp-Kaizen-metaAgent" title={`Agent ${run.agentId}${version}`}>
          {agent}
          {version}
        </span>
      )}
      {shownModel && (
        <span className="jp-Kaizen-metaModel" title="Model">
          {shownModel}
        </span>
      )}
      {summary && (
        <span className="jp-Kaizen-metaUsage" title="Tokens used by this answer's run">
          {summary}
        </span>
      )}
    </div>
  );
}

/** Live reasoning of the step in progress: collapsed, never announced, gone once it ends. */
export function Thinking({ text }: { text: string }): JSX.Element {
  return (
    <details className="jp-Kaizen-thinking">
      <summary>
        <span>Thinking…</span>
        <span className="jp-Kaizen-muted"> ({text.length.toLocaleString('en-US')} characters)</span>
      </summary>
      <div className="jp-Kaizen-thinkingText" aria-live="off">
        {text}
      </div>
    </details>
  );
}
