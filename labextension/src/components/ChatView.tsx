/**
 * One open conversation: header (back, title, shared/private, connection), transcript,
 * the queue while the room is busy, errors, the composer, and a polite live region that
 * announces committed answers only (never each streamed token).
 */
import { IRenderMimeRegistry } from '@jupyterlab/rendermime';
import React, {
  useCallback,
  useEffect,
  useLayoutEffect,
  useMemo,
  useRef,
  useState,
  useSyncExternalStore
} from 'react';

import {
  activeRun,
  conversationUsage,
  INoteView,
  IRunView,
  isBusy,
  queuedRuns,
  speakable,
  transcriptRuns,
  usageSummary
} from '../journal';
import { ArtifactsModel } from '../artifactsModel';
import { GrantsModel } from '../grants';
import { TasksModel } from '../tasks';
import { listFolder } from '../jupyterFiles';
import { ConsoleLauncher, KernelConsoleModel } from '../kernelConsole';
import { ConversationModel, Decision, IPanelPreferences } from '../model';
import { INotebookState, IProposalView } from '../notebook/edits';
import { ArtifactsPane } from './ArtifactsPane';
import { Composer } from './Composer';
import { KernelConsoleButton } from './KernelConsoleButton';
import { NotebookBar } from './NotebookBar';
import { ICodeActions } from './Markdown';
import { RunView } from './RunView';
import { TaskBar } from './TaskBar';
import { ToolGrants } from './ToolGrants';

export interface IChatViewProps {
  model: ConversationModel;
  me: string | null;
  agentName: string;
  /** Agent ids to display names (for the "produced by" line of each answer). */
  agentNames?: (agentId: string) => string;
  preferences: IPanelPreferences;
  rendermime: IRenderMimeRegistry;
  codeActions: ICodeActions;
  /** Opens JupyterLab's console on a kernel id; without it the console action is hidden. */
  launchConsole?: ConsoleLauncher;
  onBack: () => void;
}

export function ChatView(props: IChatViewProps): JSX.Element {
  const { model, me, agentName, agentNames, preferences, rendermime, codeActions, onBack } = props;
  const { launchConsole } = props;
  const snapshot = useSyncExternalStore(model.subscribe, model.getSnapshot);
  const { journal, feed, error, sending, attachments, attaching } = snapshot;
  const runs = transcriptRuns(journal);
  const queue = queuedRuns(journal);
  const active = activeRun(journal);
  const busy = isBusy(journal);
  const conversation = model.conversation;

  const usage = useMemo(() => conversationUsage(journal), [journal]);

  // Whether my persistent run_code kernel is here: asked on open and whenever a run ends
  // (a run_code call may have just made, or lost, it).
  const kernelConsole = useMemo(
    () => new KernelConsoleModel(model.api, conversation.id),
    [model, conversation.id]
  );
  useEffect(() => {
    if (launchConsole && !busy) {
      void kernelConsole.refresh();
    }
  }, [kernelConsole, launchConsole, busy]);

  // The artifacts pane: loaded on open, reloaded when the journal shows an artifact write.
  const artifacts = useMemo(
    () => new ArtifactsModel(model.api, conversation.id),
    [model, conversation.id]
  );
  const artifactState = useSyncExternalStore(artifacts.subscribe, artifacts.getSnapshot);
  useEffect(() => {
    void artifacts.refresh();
  }, [artifacts, journal.artifactSeq]);
  const [tab, setTab] = useState<'conversation' | 'artifacts'>('conversation');

  // "Allow for this conversation": loaded on open, again when a card is so decided.
  const grants = useMemo(() => new GrantsModel(model.api, conversation.id), [model, conversation.id]);
  const allowedHere = useMemo(
    () =>
      journal.runOrder.reduce(
        (n, id) => n + journal.runs[id].approvals.filter(a => a.scope === 'conversation').length,
        0
      ),
    [journal]
  );
  useEffect(() => {
    void grants.refresh();
  }, [grants, allowedHere]);
  // This conversation's durable tasks: loaded on open, again when a run settles (a task's
  // run lands here like any other).
  const tasks = useMemo(() => new TasksModel(model.api, conversation.id), [model, conversation.id]);
  const settledRuns = useMemo(
    () => journal.runOrder.filter(id => journal.runs[id].terminal !== undefined).length,
    [journal]
  );
  useEffect(() => {
    void tasks.refresh();
  }, [tasks, settledRuns]);
  const folders = useCallback(
    async (folder: string) => {
      const listed = await listFolder(model.api.settings, folder);
      return listed.ok ? listed.value : [];
    },
    [model]
  );
  const artifactCount =
    artifactState.list.phase === 'ready' ? artifactState.list.value.length : null;

  // The transcript entries (runs and notes) in journal order: light descriptors only; React
  // elements are made for the rendered window alone.
  const entries = useMemo(() => transcriptEntries(runs, journal.notes), [journal]);
  const windowed = useTranscriptWindow(entries.length);
  const visible = entries.slice(windowed.start);

  const onCancel = useCallback((runId: string) => void model.cancel(runId), [model]);
  const onCancelCredential = useCallback(
    (id: string) => model.cancelCredential(id),
    [model]
  );
  const credentialFormUrl = useCallback(
    (formPath: string) => model.credentialFormUrl(formPath),
    [model]
  );
  const onDecide = useCallback(
    (id: string, decision: Decision) => model.decide(id, decision),
    [model]
  );
  const headingRef = useRef<HTMLHeadingElement>(null);
  useEffect(() => {
    headingRef.current?.focus();
  }, [conversation.id]);

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
        {usage.runs > 0 && (
          <span
            className="jp-Kaizen-usageTotal"
            data-tokens={usage.totalTokens}
            title={`This conversation so far: ${usage.runs} answer${usage.runs === 1 ? '' : 's'} with usage`}
          >
            {usageSummary({
              prompt: usage.promptTokens,
              completion: usage.completionTokens,
              total: usage.totalTokens,
              cost: usage.cost
            })}
          </span>
        )}
        {launchConsole && <KernelConsoleButton model={kernelConsole} launch={launchConsole} />}
        <FeedIndicator phase={feed.phase} onReconnect={() => model.reconnect()} />
      </div>
      <ToolGrants model={grants} />
      <TaskBar model={tasks} />
      {(feed.phase === 'failed' || feed.phase === 'reconnecting') && (
        <p className="jp-Kaizen-error" role="alert">
          {feed.message}
        </p>
      )}
      <ChatTabs
        conversationId={conversation.id}
        tab={tab}
        artifactCount={artifactCount}
        onSelect={setTab}
      />
      <div
        className="jp-Kaizen-artifactsPanel"
        id={`kaizen-artifacts-${conversation.id}`}
        role="tabpanel"
        aria-labelledby={`kaizen-tab-artifacts-${conversation.id}`}
        hidden={tab !== 'artifacts'}
      >
        <ArtifactsPane
          model={artifacts}
          journal={journal}
          rendermime={rendermime}
          me={me}
          api={model.api}
        />
      </div>
      <div
        className="jp-Kaizen-transcript"
        id={`kaizen-transcript-${conversation.id}`}
        hidden={tab !== 'conversation'}
        ref={windowed.scroller}
        onScroll={windowed.onScroll}
        role="log"
        aria-label="Conversation"
        aria-live="off"
        tabIndex={0}
      >
        <div className="jp-Kaizen-transcriptInner" ref={windowed.inner}>
          {windowed.start > 0 && (
            <button
              type="button"
              className="jp-Kaizen-linkButton jp-Kaizen-earlier"
              onClick={windowed.showEarlier}
            >
              Show earlier messages ({windowed.start})
            </button>
          )}
          {feed.phase === 'loading' && !entries.length && (
            <p className="jp-Kaizen-status">Loading the conversation…</p>
          )}
          {feed.phase !== 'loading' && !entries.length && !queue.length && (
            <p className="jp-Kaizen-empty">No messages yet. Say hello below.</p>
          )}
          {visible.map(entry =>
            entry.run ? (
              <RunView
                key={entry.key}
                run={entry.run}
                me={me}
                rendermime={rendermime}
                codeActions={codeActions}
                agentName={agentNames}
                onCancel={onCancel}
                onDecide={onDecide}
                credentialFormUrl={credentialFormUrl}
                onCancelCredential={onCancelCredential}
                proposals={proposalsOf(journal.notebook, entry.run.runId)}
              />
            ) : (
              <p key={entry.key} className="jp-Kaizen-note">
                {entry.note?.text}
              </p>
            )
          )}
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
      <NotebookBar
        conversationId={conversation.id}
        attachments={model.notebooks}
        attachedHere={journal.notebook.attached}
        allowedBy={journal.notebook.kernelAccess}
        me={me}
      />
      <Composer
        busy={busy}
        sending={sending}
        disabled={feed.phase === 'failed' && journal.lastSeq === 0}
        sendKey={preferences.sendKey}
        onSend={(text, kind) => model.send(text, kind)}
        attachments={attachments}
        attaching={attaching}
        onDetach={id => model.detach(id)}
        listFolder={folders}
        onAttach={path => void model.attach(path)}
      />
      <div className="jp-Kaizen-srOnly" aria-live="polite" aria-atomic="true" role="status">
        {journal.announcement ? `Answer: ${speakable(journal.announcement.text)}` : ''}
      </div>
    </div>
  );
}

/** A run's proposals, the same array while they do not change (RunView is memoized). */
function proposalsOf(state: INotebookState, runId: string): readonly IProposalView[] | undefined {
  const ids = state.byRun[runId];
  if (!ids) {
    return undefined;
  }
  let cached = PROPOSALS.get(ids);
  const current = ids.map(id => state.proposals[id]);
  if (!cached || cached.some((p, i) => p !== current[i])) {
    cached = current;
    PROPOSALS.set(ids, cached);
  }
  return cached;
}

const PROPOSALS = new WeakMap<readonly string[], readonly IProposalView[]>();

interface IEntry {
  seq: number;
  key: string;
  run?: IRunView;
  note?: INoteView;
}

export function transcriptEntries(runs: IRunView[], notes: readonly INoteView[]): IEntry[] {
  const entries: IEntry[] = runs.map(run => ({
    seq: run.input?.seq ?? run.seq,
    key: run.runId,
    run
  }));
  for (const note of notes) {
    entries.push({ seq: note.seq, key: `note-${note.seq}`, note });
  }
  return entries.sort((a, b) => a.seq - b.seq);
}

/** Entries rendered at first, and added per "show earlier" (or scroll to the top). */
export const WINDOW_PAGE = 40;

/**
 * Windowed rendering of a long transcript: only the latest entries are in the DOM (a
 * conversation of thousands of events opens as fast as a short one); scrolling to the top,
 * or the "Show earlier messages" button, adds a page above while the view stays where it
 * was. Back at the bottom, the window shrinks again to the latest page.
 *
 * Also keeps the view stuck to the bottom while the member is there; Markdown renders
 * asynchronously, so this follows the content's size, not only React renders.
 */
function useTranscriptWindow(total: number): {
  start: number;
  scroller: React.RefObject<HTMLDivElement>;
  inner: React.RefObject<HTMLDivElement>;
  onScroll: (event: React.UIEvent<HTMLDivElement>) => void;
  showEarlier: () => void;
} {
  // The first rendered entry, counted from the end (stable while new entries arrive).
  const [fromEnd, setFromEnd] = useState(WINDOW_PAGE);
  const scroller = useRef<HTMLDivElement>(null);
  const inner = useRef<HTMLDivElement>(null);
  const atBottom = useRef(true);
  const anchor = useRef<{ el: Element; offset: number; until: number } | null>(null);
  const prevTotal = useRef(total);
  // The scrollTop this hook set last: a scroll elsewhere is the member's.
  const ownScroll = useRef(-1);

  // New entries while the member reads older ones: keep the same first entry rendered.
  let shown = fromEnd;
  if (total > prevTotal.current && !atBottom.current && fromEnd > WINDOW_PAGE) {
    shown = fromEnd + (total - prevTotal.current);
  }
  prevTotal.current = total;
  if (shown !== fromEnd) {
    setFromEnd(shown);
  }
  const start = Math.max(0, total - shown);

  const restore = (): void => {
    const el = scroller.current;
    if (!el) {
      return;
    }
    const a = anchor.current;
    if (a) {
      if (Date.now() > a.until || !a.el.isConnected) {
        anchor.current = null;
      } else {
        const offset = a.el.getBoundingClientRect().top - el.getBoundingClientRect().top;
        el.scrollTop += offset - a.offset;
        ownScroll.current = el.scrollTop;
        return;
      }
    }
    if (atBottom.current) {
      el.scrollTop = el.scrollHeight;
    }
  };
  useLayoutEffect(restore);
  useEffect(() => {
    if (!inner.current || typeof ResizeObserver === 'undefined') {
      return;
    }
    const observer = new ResizeObserver(restore);
    observer.observe(inner.current);
    return () => observer.disconnect();
  }, []);

  const showEarlier = useCallback((): void => {
    const el = scroller.current;
    const first = inner.current?.querySelector(':scope > .jp-Kaizen-run, :scope > .jp-Kaizen-note');
    if (el && first) {
      // Keep the entry now on top where it is while the page above renders (and its
      // Markdown settles).
      anchor.current = {
        el: first,
        offset: first.getBoundingClientRect().top - el.getBoundingClientRect().top,
        until: Date.now() + 1500
      };
    }
    atBottom.current = false;
    setFromEnd(n => n + WINDOW_PAGE);
  }, []);

  const onScroll = (event: React.UIEvent<HTMLDivElement>): void => {
    const el = event.currentTarget;
    if (anchor.current && (Date.now() > anchor.current.until || el.scrollTop !== ownScroll.current)) {
      anchor.current = null; // the member scrolled: stop holding the view
    }
    const bottom = el.scrollHeight - el.scrollTop - el.clientHeight < 40;
    if (bottom !== atBottom.current) {
      atBottom.current = bottom;
      if (bottom) {
        anchor.current = null;
        setFromEnd(WINDOW_PAGE); // back at the latest: drop the older pages from the DOM
      }
    }
    if (el.scrollTop < 80 && total - fromEnd > 0 && !anchor.current) {
      showEarlier();
    }
  };

  return { start, scroller, inner, onScroll, showEarlier };
}

/** "Conversation" / "Artifacts (n)": a tab list (arrow keys move between the two tabs). */
function ChatTabs({
  conversationId,
  tab,
  artifactCount,
  onSelect
}: {
  conversationId: string;
  tab: 'conversation' | 'artifacts';
  artifactCount: number | null;
  onSelect: (tab: 'conversation' | 'artifacts') => void;
}): JSX.Element {
  const tabs: Array<{ id: 'conversation' | 'artifacts'; label: string; controls: string }> = [
    { id: 'conversation', label: 'Conversation', controls: `kaizen-transcript-${conversationId}` },
    {
      id: 'artifacts',
      label: artifactCount === null ? 'Artifacts' : `Artifacts (${artifactCount})`,
      controls: `kaizen-artifacts-${conversationId}`
    }
  ];
  const refs = useRef<Array<HTMLButtonElement | null>>([]);
  const onKeyDown = (event: React.KeyboardEvent, index: number): void => {
    if (event.key !== 'ArrowRight' && event.key !== 'ArrowLeft') {
      return;
    }
    event.preventDefault();
    const next = (index + (event.key === 'ArrowRight' ? 1 : tabs.length - 1)) % tabs.length;
    onSelect(tabs[next].id);
    refs.current[next]?.focus();
  };
  return (
    <div className="jp-Kaizen-tabs" role="tablist" aria-label="Conversation views">
      {tabs.map((t, i) => (
        <button
          key={t.id}
          ref={el => {
            refs.current[i] = el;
          }}
          type="button"
          role="tab"
          id={`kaizen-tab-${t.id}-${conversationId}`}
          className="jp-Kaizen-tab"
          data-tab={t.id}
          aria-selected={tab === t.id}
          aria-controls={t.controls}
          tabIndex={tab === t.id ? 0 : -1}
          onClick={() => onSelect(t.id)}
          onKeyDown={event => onKeyDown(event, i)}
        >
          {t.label}
        </button>
      ))}
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
