/**
 * The panel's state outside React: the roster, the conversation list, and one
 * `ConversationModel` per opened conversation (journal state + feed + actions).
 *
 * Each model is a tiny external store (`subscribe` / `getSnapshot`) for React's
 * `useSyncExternalStore`; snapshots are immutable, so a render reads one consistent state.
 */
import {
  ApprovalMode,
  credentialFormUrl,
  IAgent,
  IConversation,
  IMe,
  KaizenApi,
  newIdempotencyKey
} from './api';
import { ConversationFeed, FeedStatus, ISocket } from './events';
import { IAttachment, mentionedPaths, readJupyterFile } from './jupyterFiles';
import { applyFrames, IConversationState, initialState, isBusy, isTerminal } from './journal';
import { NotebookAttachments } from './notebook/attachments';
import { Frame } from './protocol';

type Listener = () => void;

/** The minimal external-store contract React's `useSyncExternalStore` needs. */
export class Observable<T> {
  constructor(protected _value: T) {}

  readonly subscribe = (listener: Listener): (() => void) => {
    this._listeners.add(listener);
    return () => this._listeners.delete(listener);
  };

  readonly getSnapshot = (): T => this._value;

  protected set(value: T): void {
    if (value === this._value) {
      return;
    }
    this._value = value;
    for (const listener of [...this._listeners]) {
      listener();
    }
  }

  private readonly _listeners = new Set<Listener>();
}

export interface IConversationSnapshot {
  journal: IConversationState;
  feed: FeedStatus;
  /** A member-safe sentence from the last failed action, or null. */
  error: string | null;
  sending: boolean;
  /** Jupyter files read for the next message (chips in the composer). */
  attachments: readonly IAttachment[];
  /** A Jupyter file is being read. */
  attaching: boolean;
}

/** How many files one message may attach (the server's bound). */
export const MAX_ATTACHMENTS = 8;

export type Decision = 'approve' | 'deny' | 'allow_conversation';

interface IAttempt {
  text: string;
  kind: 'message' | 'steering';
  attachments: string;
  key: string;
}

/** One conversation: its journal state, its live feed and what the member can do in it. */
export class ConversationModel extends Observable<IConversationSnapshot> {
  constructor(
    readonly api: KaizenApi,
    readonly conversation: IConversation,
    openSocket: (url: string) => ISocket = url => new WebSocket(url) as unknown as ISocket
  ) {
    super({
      journal: initialState(conversation.id),
      feed: { phase: 'loading' },
      error: null,
      sending: false,
      attachments: [],
      attaching: false
    });
    this._openSocket = openSocket;
    this.notebooks = new NotebookAttachments(api, conversation.id);
  }

  /** Notebooks attached to every message sent here until removed (re-pinned each time). */
  readonly notebooks: NotebookAttachments;

  /** Start (or resume after `stop()`) the feed from the last applied seq. */
  start(): void {
    if (this._feed && !this._feed.disposed) {
      return;
    }
    const id = this.conversation.id;
    this._feed = new ConversationFeed({
      conversationId: id,
      loadPage: (after, limit) => this.api.journal(id, after, limit),
      socketUrl: after => this.api.eventsUrl(id, after),
      openSocket: this._openSocket,
      lastSeq: () => this._pending.length ? this._flushNow() : this._value.journal.lastSeq,
      onFrames: (frames, live) => this._enqueue(frames, live),
      onStatus: feed => this.set({ ...this._value, feed })
    });
    void this._feed.start();
  }

  /** Whether the live feed runs (or is starting / reconnecting). */
  get watching(): boolean {
    return this._feed !== null && !this._feed.disposed;
  }

  /** Close the socket; `start()` later resumes from the last applied seq. */
  stop(): void {
    this._flushNow();
    this._feed?.dispose();
    this._feed = null;
  }

  /** Drop and reopen the socket (resumes from the last applied seq). */
  reconnect(): void {
    this._feed?.reconnectNow();
  }

  /**
   * Send a message or a steering note. A retry of the same text and kind (after a failure)
   * re-uses the idempotency key, so the server accepts it at most once.
   */
  async send(text: string, kind: 'message' | 'steering'): Promise<boolean> {
    const trimmed = text.trim();
    if (!trimmed || this._value.sending) {
      return false;
    }
    this.set({ ...this._value, sending: true, error: null });
    // `@path` tokens name Jupyter files too: each is read (by the server) before sending.
    for (const path of mentionedPaths(text)) {
      if (!this._value.attachments.some(a => a.path === path)) {
        const problem = await this._attach(path);
        if (problem) {
          this.set({ ...this._value, sending: false, error: `@${path}: ${problem}` });
          return false;
        }
      }
    }
    // Attached notebooks are pinned afresh for every message, beside the attached files.
    const pinned = await this.notebooks.pin();
    const files = this._value.attachments.map(a => a.artifactId);
    const ids = pinned.ok ? [...files, ...pinned.value] : files;
    const last = this._lastFailed;
    const same =
      last && last.text === text && last.kind === kind && last.attachments === ids.join(',');
    const key = same ? last.key : newIdempotencyKey();
    const attempt: IAttempt = { text, kind, attachments: ids.join(','), key };
    if (!pinned.ok) {
      this._lastFailed = attempt;
      this.set({ ...this._value, sending: false, error: pinned.message });
      return false;
    }
    const result = await this.api.postMessage(this.conversation.id, {
      text,
      kind,
      idempotency_key: key,
      ...(ids.length ? { attachments: ids } : {})
    });
    if (result.ok) {
      this._lastFailed = null;
      this.set({ ...this._value, sending: false, attachments: [] });
      return true;
    }
    this._lastFailed = attempt;
    this.set({ ...this._value, sending: false, error: result.message });
    return false;
  }

  async cancel(runId: string): Promise<void> {
    const result = await this.api.cancelRun(runId);
    this.set({ ...this._value, error: result.ok ? null : result.message });
  }

  /** Attach a Jupyter file (read by the server) to the next message; false on failure. */
  async attach(path: string): Promise<boolean> {
    this.set({ ...this._value, attaching: true, error: null });
    const problem = await this._attach(path);
    this.set({ ...this._value, attaching: false, error: problem ?? this._value.error });
    return problem === null;
  }

  /** Take a file off the next message. */
  detach(artifactId: string): void {
    this.set({
      ...this._value,
      attachments: this._value.attachments.filter(a => a.artifactId !== artifactId)
    });
  }

  private async _attach(path: string): Promise<string | null> {
    const result = await readJupyterFile(this.api, path);
    if (!result.ok) {
      return result.message;
    }
    const file = result.value;
    const others = this._value.attachments.filter(a => a.artifactId !== file.artifactId);
    if (others.length >= MAX_ATTACHMENTS) {
      return `A message can carry at most ${MAX_ATTACHMENTS} files.`;
    }
    this.set({ ...this._value, attachments: [...others, file] });
    return null;
  }

  async decide(approvalId: string, decision: Decision): Promise<void> {
    const result =
      decision === 'allow_conversation'
        ? await this.api.decideApproval(approvalId, 'approve', 'conversation')
        : await this.api.decideApproval(approvalId, decision);
    // The card resolves from the `approval.decided` event, for every viewer alike.
    this.set({ ...this._value, error: result.ok ? null : result.message });
  }

  /** Decline a paused call's credential; the card resolves from `credential.settled`. */
  async cancelCredential(requestId: string): Promise<void> {
    const result = await this.api.cancelCredentialRequest(requestId);
    this.set({ ...this._value, error: result.ok ? null : result.message });
  }

  /** The URL of a paused call's form on this server, or null. */
  credentialFormUrl(formPath: string): string | null {
    return credentialFormUrl(this.api.settings.baseUrl, formPath);
  }

  dismissError(): void {
    this.set({ ...this._value, error: null });
  }

  dispose(): void {
    this.stop();
  }

  /** Frames are batched per animation frame: a burst of deltas is one render. */
  private _enqueue(frames: Frame[], live: boolean): void {
    if (!live) {
      this._flushNow();
      this._apply(frames, false);
      return;
    }
    this._pending.push(...frames);
    if (this._scheduled === null) {
      const raf = (globalThis as { requestAnimationFrame?: (cb: () => void) => number })
        .requestAnimationFrame;
      this._scheduled = raf ? raf(() => this._flushNow()) : setTimeout(() => this._flushNow(), 16);
    }
  }

  private _flushNow(): number {
    if (this._scheduled !== null) {
      const caf = (globalThis as { cancelAnimationFrame?: (h: number) => void })
        .cancelAnimationFrame;
      if (caf && typeof this._scheduled === 'number') {
        caf(this._scheduled);
      } else {
        clearTimeout(this._scheduled as ReturnType<typeof setTimeout>);
      }
      this._scheduled = null;
    }
    if (this._pending.length) {
      const frames = this._pending;
      this._pending = [];
      this._apply(frames, true);
    }
    return this._value.journal.lastSeq;
  }

  private _apply(frames: Frame[], live: boolean): void {
    const journal = applyFrames(this._value.journal, frames, { announce: live });
    if (journal !== this._value.journal) {
      this.set({ ...this._value, journal });
    }
  }

  private readonly _openSocket: (url: string) => ISocket;
  private _feed: ConversationFeed | null = null;
  private _pending: Frame[] = [];
  private _scheduled: unknown = null;
  private _lastFailed: IAttempt | null = null;
}

export type Loadable<T> =
  | { phase: 'loading' }
  | { phase: 'ready'; value: T }
  | { phase: 'error'; message: string };

/** What the conversation list shows about a conversation besides its title. */
export interface IActivity {
  /** A run works or waits (admitted and not ended, or queued). */
  busy: boolean;
  /** Approval requests waiting for a decision. */
  approvals: number;
}

export interface IPanelSnapshot {
  agents: Loadable<IAgent[]>;
  conversations: Loadable<IConversation[]>;
  me: IMe | null;
  selectedId: string | null;
  /**
   * Badges of the conversation list. Conversations watched live (open, or left while busy)
   * come from their journal; the others from `GET approvals?status=pending` at the last
   * refresh and the listing's `active_run` of each conversation.
   */
  activity: Readonly<Record<string, IActivity>>;
  /** A member-safe sentence from the last failed panel action, or null. */
  error: string | null;
}

export interface IPanelPreferences {
  defaultAgent: string;
  approvalMode: ApprovalMode | '';
  sendKey: 'Enter' | 'Mod+Enter';
}

/** The whole panel: roster, conversations, selection, preferences. */
export class PanelModel extends Observable<IPanelSnapshot> {
  constructor(readonly api: KaizenApi) {
    super({
      agents: { phase: 'loading' },
      conversations: { phase: 'loading' },
      me: null,
      selectedId: null,
      activity: {},
      error: null
    });
  }

  readonly preferences = new PreferencesStore();

  async refresh(): Promise<void> {
    this.set({ ...this._value, agents: { phase: 'loading' }, conversations: { phase: 'loading' } });
    const [agents, conversations, me, approvals] = await Promise.all([
      this.api.agents(),
      this.api.conversations(),
      this.api.me(),
      this.api.pendingApprovals()
    ]);
    if (approvals.ok) {
      const pending: Record<string, number> = {};
      for (const approval of approvals.value) {
        if (approval.status === 'pending' && approval.conversation_id) {
          pending[approval.conversation_id] = (pending[approval.conversation_id] ?? 0) + 1;
        }
      }
      this._pendingApprovals = pending;
    }
    if (conversations.ok) {
      this._busyAtRefresh = new Set(
        conversations.value.filter(c => c.active_run).map(c => c.id)
      );
    }
    this.set({
      ...this._value,
      me: me.ok ? me.value : this._value.me,
      agents: agents.ok
        ? { phase: 'ready', value: agents.value }
        : { phase: 'error', message: agents.message },
      conversations: conversations.ok
        ? { phase: 'ready', value: sortConversations(conversations.value) }
        : { phase: 'error', message: conversations.message }
    });
    this._updateActivity();
  }

  async create(agentId: string, shared: boolean, title?: string): Promise<boolean> {
    const result = await this.api.createConversation({
      agent_id: agentId,
      shared,
      ...(title ? { title } : {})
    });
    if (!result.ok) {
      this.set({ ...this._value, error: result.message });
      return false;
    }
    const list =
      this._value.conversations.phase === 'ready' ? this._value.conversations.value : [];
    this.set({
      ...this._value,
      error: null,
      conversations: { phase: 'ready', value: [result.value, ...list] }
    });
    this.select(result.value.id);
    return true;
  }

  /**
   * Send `text` into the open conversation, or (none open) into a new private one with the
   * default agent. Returns null when the server accepted it, else a member-safe sentence
   * (also shown in the panel).
   */
  async ask(text: string, title: string, notebookPath?: string): Promise<string | null> {
    let id = this._value.selectedId;
    if (!id || !this.conversationModel(id)) {
      if (this._value.agents.phase !== 'ready') {
        await this.refresh();
      }
      const agents = this._value.agents.phase === 'ready' ? this._value.agents.value : [];
      const preferred = this.preferences.getSnapshot().defaultAgent;
      const agent = agents.find(a => a.id === preferred) ?? agents[0];
      if (!agent) {
        const message =
          this._value.agents.phase === 'error'
            ? this._value.agents.message
            : 'No agent is available to ask.';
        this.reportError(message);
        return message;
      }
      if (!(await this.create(agent.id, false, title))) {
        return this._value.error ?? 'Kaizen could not start a conversation.';
      }
      id = this._value.selectedId;
    }
    const model = this.conversationModel(id);
    if (!model) {
      return 'Kaizen could not open the conversation.';
    }
    if (notebookPath) {
      model.notebooks.add(notebookPath);
    }
    const ok = await model.send(text, 'message');
    return ok ? null : model.getSnapshot().error;
  }

  /**
   * "Attach to Kaizen" from the file browser: the file goes onto the next message of the open
   * conversation, or of a new private one with the default agent. Null when attached, else a
   * member-safe sentence (also shown in the panel).
   */
  async attachFile(path: string): Promise<string | null> {
    const model = await this._openOrStart(path.split('/').pop() || 'Attached file');
    if (typeof model === 'string') {
      return model;
    }
    const ok = await model.attach(path);
    return ok ? null : model.getSnapshot().error;
  }

  private async _openOrStart(title: string): Promise<ConversationModel | string> {
    const open = this.conversationModel(this._value.selectedId);
    if (open) {
      return open;
    }
    if (this._value.agents.phase !== 'ready') {
      await this.refresh();
    }
    const agents = this._value.agents.phase === 'ready' ? this._value.agents.value : [];
    const preferred = this.preferences.getSnapshot().defaultAgent;
    const agent = agents.find(a => a.id === preferred) ?? agents[0];
    if (!agent) {
      const message = 'No agent is available to attach the file to.';
      this.reportError(message);
      return message;
    }
    if (!(await this.create(agent.id, false, title))) {
      return this._value.error ?? 'Kaizen could not start a conversation.';
    }
    return this.conversationModel(this._value.selectedId) ?? 'Kaizen could not open the conversation.';
  }

  select(id: string | null): void {
    const previous = this._value.selectedId;
    this.set({ ...this._value, selectedId: id });
    if (previous && previous !== id) {
      // A busy conversation stays watched until it settles: its list badge stays live.
      const model = this._models.get(previous);
      if (model && !isBusy(model.getSnapshot().journal)) {
        model.stop();
      }
    }
    this.conversationModel(id)?.start();
    if (id) {
      // The conversation is open now: its completion notices are read. Only this exact
      // destination is acknowledged; a failure leaves them unread (nothing to show).
      void this.api.acknowledgeOpen({ kind: 'chat', resource_id: id }).catch(() => undefined);
    }
    this._updateActivity();
  }

  /** The model of a listed conversation (kept while the panel lives: switching resumes). */
  conversationModel(id: string | null): ConversationModel | null {
    if (!id) {
      return null;
    }
    let model = this._models.get(id);
    if (!model) {
      const list =
        this._value.conversations.phase === 'ready' ? this._value.conversations.value : [];
      const conversation = list.find(c => c.id === id);
      if (!conversation) {
        return null;
      }
      model = this._newModel(conversation);
      const watched = model;
      this._models.set(id, model);
      watched.subscribe(() => this._onModelChange(id, watched));
    }
    return model;
  }

  /** A new conversation model (a seam for tests). */
  protected _newModel(conversation: IConversation): ConversationModel {
    return new ConversationModel(this.api, conversation);
  }

  private _onModelChange(id: string, model: ConversationModel): void {
    if (id !== this._value.selectedId && model.watching) {
      const { journal, feed } = model.getSnapshot();
      if (feed.phase === 'live' && !isBusy(journal)) {
        model.stop(); // settled in the background: nothing more to watch
      }
    }
    this._updateActivity();
  }

  /** Recompute the list badges; publishes only when one changed. */
  private _updateActivity(): void {
    const next: Record<string, IActivity> = {};
    for (const [id, count] of Object.entries(this._pendingApprovals)) {
      next[id] = { busy: false, approvals: count };
    }
    // Conversations not watched live: the server's listing said whether a run was active.
    for (const id of this._busyAtRefresh) {
      next[id] = { busy: true, approvals: next[id]?.approvals ?? 0 };
    }
    for (const [id, model] of this._models) {
      const { journal, feed } = model.getSnapshot();
      if (!model.watching || (feed.phase === 'loading' && journal.lastSeq === 0)) {
        continue; // not watched: the last refresh's answer stands
      }
      this._busyAtRefresh.delete(id); // its own journal is newer than the listing
      next[id] = liveActivity(journal);
    }
    for (const id of Object.keys(next)) {
      if (!next[id].busy && !next[id].approvals) {
        delete next[id];
      }
    }
    if (!sameActivity(next, this._value.activity)) {
      this.set({ ...this._value, activity: next });
    }
  }

  dismissError(): void {
    this.set({ ...this._value, error: null });
  }

  reportError(message: string): void {
    this.set({ ...this._value, error: message });
  }

  dispose(): void {
    for (const model of this._models.values()) {
      model.dispose();
    }
    this._models.clear();
  }

  private readonly _models = new Map<string, ConversationModel>();
  private _pendingApprovals: Record<string, number> = {};
  private _busyAtRefresh = new Set<string>();
}

/** The list badges of a conversation from its journal. */
export function liveActivity(journal: IConversationState): IActivity {
  let approvals = 0;
  for (const id of journal.runOrder) {
    const run = journal.runs[id];
    if (isTerminal(run)) {
      continue;
    }
    for (const approval of run.approvals) {
      if (approval.decision === undefined) {
        approvals += 1;
      }
    }
  }
  return { busy: isBusy(journal), approvals };
}

function sameActivity(
  a: Readonly<Record<string, IActivity>>,
  b: Readonly<Record<string, IActivity>>
): boolean {
  const keys = Object.keys(a);
  if (keys.length !== Object.keys(b).length) {
    return false;
  }
  return keys.every(k => b[k] && b[k].busy === a[k].busy && b[k].approvals === a[k].approvals);
}

/** The member's panel preferences, mirrored from the JupyterLab settings registry. */
export class PreferencesStore extends Observable<IPanelPreferences> {
  constructor() {
    super({ defaultAgent: '', approvalMode: '', sendKey: 'Enter' });
  }

  update(value: Partial<IPanelPreferences>): void {
    this.set({ ...this._value, ...value });
  }
}

function sortConversations(list: IConversation[]): IConversation[] {
  return [...list].sort((a, b) => (b.updated_at ?? '').localeCompare(a.updated_at ?? ''));
}
