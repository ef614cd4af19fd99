/**
 * One open conversation: header (back, title, shared/private, connection), transcript,
 * the queue while the room is busy, errors, the composer, and a polite live region that
 * announces committed answers only (never each streamed token).
 */
import { IRenderMimeRegistry } from '@jupyterlab/rendermime';
import React, { useEffect, useLayoutEffect, useRef, useSyncExternalStore } from 'react';

import { activeRun, isBusy, queuedRuns, speakable, transcriptRuns } from '../journal';
import { ConversationModel, IPanelPreferences } from '../model';
import { Composer } from './Composer';
import { ICodeActions } from './Markdown';
import { RunView } from './RunView';

export interface IChatViewProps {
  model: ConversationModel;
  me: string | null;
  agentName: string;
  preferences: IPanelPreferences;
  rendermime: IRenderMimeRegistry;
  codeActions: ICodeActions;
  onBack: () => void;
}

export function ChatView(props: IChatViewProps): JSX.Element {
  const { model, me, agentName, preferences, rendermime, codeActions, onBack } = props;
  const snapshot = useSyncExternalStore(model.subscribe, model.getSnapshot);
  const { journal, feed, error, sending } = snapshot;
  const runs = transcriptRuns(journal);
  const queue = queuedRuns(journal);
  const active = activeRun(journal);
  const busy = isBusy(journal);
  const conversation = model.conversation;

  // Stick to the bottom while the member is already there.
  // Markdown renders asynchronously, so follow the content's size, not only React renders.
  const scroller = useRef<HTMLDivElement>(null);
  const inner = useRef<HTMLDivElement>(null);
  const atBottom = useRef(true);
  const stick = (): void => {
    const el = scroller.current;
    if (el && atBottom.current) {
      el.scrollTop = el.scrollHeight;
    }
  };
  useLayoutEffect(stick);
  useEffect(() => {
    if (!inner.current || typeof ResizeObserver === 'undefined') {
      return;
    }
    const observer = new ResizeObserver(stick);
    observer.observe(inner.current);
    return () => observer.disconnect();
  }, []);
  const headingRef = useRef<HTMLHeadingElement>(null);
  useEffect(() => {
    headingRef.current?.focus();
  }, [conversation.id]);

  type Entry = { seq: number; key: string; node: JSX.Element };
  const entries: Entry[] = runs.map(run => ({
    seq: run.input?.seq ?? run.seq,
    key: run.runId,
    node: (
      <RunView
        key={run.runId}
        run={run}
        me={me}
        rendermime={rendermime}
        codeActions={codeActions}
        onCancel={runId => void model.cancel(runId)}
        onDecide={(id, decision) => model.decide(id, decision)}
      />
    )
  }));
  for (const note of journal.notes) {
    entries.push({
      seq: note.seq,
      key: `note-${note.seq}`,
      node: (
        <p key={`note-${note.seq}`} className="jp-Kaizen-note">
          {note.text}
        </p>
      )
    });
  }
  entries.sort((a, b) => a.seq - b.seq);

  return (
    <div className="jp-Kaizen-chat" data-conversation-id={conversation.id}>
      <div className="jp-Kaizen-chatHeader">
        <button
          type="button"
          className="jp-Kaizen-iconButton"
          onClick={onBack}
          aria-label="Back to the conversations"
          title="Back to the conversations"
        >
          ←
        </button>
        <h2 className="jp-Kaizen-chatTitle" tabIndex={-1} ref={headingRef}>
          {conversation.title}
        </h2>
        <SharedBadge shared={conversation.shared} />
      </div>
      <div className="jp-Kaizen-chatSub">
        <span>{agentName}</span>
        <FeedIndicator phase={feed.phase} onReconnect={() => model.reconnect()} />
      </div>
      {(feed.phase === 'failed' || feed.phase === 'reconnecting') && (
        <p className="jp-Kaizen-error" role="alert">
          {feed.message}
        </p>
      )}
      <div
        className="jp-Kaizen-transcript"
        ref={scroller}
        onScroll={event => {
          const el = event.currentTarget;
          atBottom.current = el.scrollHeight - el.scrollTop - el.clientHeight < 40;
        }}
        role="log"
        aria-label="Conversation"
        aria-live="off"
        tabIndex={0}
      >
        <div className="jp-Kaizen-transcriptInner" ref={inner}>
          {feed.phase === 'loading' && !entries.length && (
            <p className="jp-Kaizen-status">Loading the conversation…</p>
          )}
          {feed.phase !== 'loading' && !entries.length && !queue.length && (
            <p className="jp-Kaizen-empty">No messages yet. Say hello below.</p>
          )}
          {entries.map(entry => entry.node)}
        </div>
      </div>
      {queue.length > 0 && (
        <section className="jp-Kaizen-queue" aria-label="Queued messages">
          <h3 className="jp-Kaizen-queueTitle">
            Queued ({queue.length}){active ? ' — waiting for the current run' : ''}
          </h3>
          <ol>
            {queue.map(run => (
              <li key={run.runId} className="jp-Kaizen-queueItem" data-run-id={run.runId}>
                <span className="jp-Kaizen-queueText">
                  {run.input?.kind === 'steering' && <span className="jp-Kaizen-badge">steering</span>}
                  {run.input?.text ?? ''}
                </span>
                <button
                  type="button"
                  className="jp-Kaizen-iconButton"
                  aria-label="Withdraw this queued message"
                  title="Withdraw this queued message"
                  onClick={() => void model.cancel(run.runId)}
                >
                  ×
                </button>
              </li>
            ))}
          </ol>
        </section>
      )}
      {error && (
        <div className="jp-Kaizen-error" role="alert">
          <span>{error}</span>
          <button
            type="button"
            className="jp-Kaizen-iconButton"
            aria-label="Dismiss"
            onClick={() => model.dismissError()}
          >
            ×
          </button>
        </div>
      )}
      <Composer
        busy={busy}
        sending={sending}
        disabled={feed.phase === 'failed' && journal.lastSeq === 0}
        sendKey={preferences.sendKey}
        onSend={(text, kind) => model.send(text, kind)}
      />
      <div className="jp-Kaizen-srOnly" aria-live="polite" aria-atomic="true" role="status">
        {journal.announcement ? `Answer: ${speakable(journal.announcement.text)}` : ''}
      </div>
    </div>
  );
}

export function SharedBadge({ shared }: { shared: boolean }): JSX.Element {
  return (
    <span
      className={`jp-Kaizen-badge ${shared ? 'jp-Kaizen-shared' : 'jp-Kaizen-private'}`}
      title={shared ? 'Shared: other members can take part' : 'Private: only you'}
    >
      {shared ? 'shared' : 'private'}
    </span>
  );
}

function FeedIndicator({
  phase,
  onReconnect
}: {
  phase: string;
  onReconnect: () => void;
}): JSX.Element {
  const label: Record<string, string> = {
    loading: 'loading',
    live: 'live',
    reconnecting: 'reconnecting',
    failed: 'offline',
    closed: 'closed'
  };
  return (
    <span className="jp-Kaizen-feed" data-phase={phase}>
      <span className="jp-Kaizen-feedDot" aria-hidden="true" />
      {label[phase] ?? phase}
      {phase === 'reconnecting' && (
        <button type="button" className="jp-Kaizen-linkButton" onClick={onReconnect}>
          retry now
        </button>
      )}
    </span>
  );
}
