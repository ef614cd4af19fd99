/**
 * The journal reducer: events → the view state of one conversation.
 *
 * Pure and immutable (a changed part is a new object, an unchanged one is shared), so React
 * re-renders only what moved and the unit tests run under plain Node.
 *
 * - Durable events are applied once: an event whose `seq` is not above `lastSeq` is a
 *   duplicate (a replayed page, a reconnect overlap) and changes nothing.
 * - Live `answer.delta` text accumulates per (run, step) while streaming; the run's
 *   `answer.committed` for that step replaces it in place (same answer entry, same key).
 * - The queue is derived: runs whose input was accepted, not yet admitted, not terminal.
 * - Tool calls form a per-run timeline: requested → settled with outcome and duration.
 */
import { mayWriteArtifacts } from './artifacts';
import { applyNotebookEvent, EMPTY_NOTEBOOK_STATE, INotebookState } from './notebook/edits';
import { Data, Frame, IJournalEvent, ILiveFrame, isRecord, num, str } from './protocol';

export type RunStatus =
  | 'queued'
  | 'running'
  | 'awaiting_approval'
  | 'completed'
  | 'failed'
  | 'answer_unavailable'
  | 'cancelled';

export const TERMINAL_STATUSES: ReadonlySet<string> = new Set([
  'completed',
  'failed',
  'answer_unavailable',
  'cancelled'
]);

export type ToolOutcome = 'ok' | 'error' | 'raised' | 'timeout' | 'abandoned' | 'suppressed';

export interface IInputView {
  inputId: string;
  position: number;
  text: string;
  kind: 'message' | 'steering';
  member: string;
  at: string;
  seq: number;
}

export interface IToolCallView {
  callId: string;
  name: string;
  step: number;
  capability: string;
  arguments?: unknown;
  /** Set once settled. */
  outcome?: string;
  content?: unknown;
  /**
   * The backend's generation placeholders (`tool.requested`) and the durable files stored
   * for them (`tool.settled`), kept as sent; `generationEntries()` reads them.
   */
  placeholders?: unknown;
  files?: unknown;
  /**
   * The rich output the call showed on the chat canvas (`tool.settled` `canvas`), kept as
   * sent, and whether a canvas was dropped (`canvas_dropped`); `callCanvas()` reads them
   * (R-277, R-278).
   */
  canvas?: unknown;
  canvasDropped?: boolean;
  requestedAt: string;
  settledAt?: string;
  seq: number;
}

export interface IApprovalView {
  approvalId: string;
  tool: string;
  capability: string;
  arguments: unknown;
  argsDigest: string;
  /** `approved` / `denied` once decided. */
  decision?: string;
  decidedBy?: string;
  /** `conversation` when approved with "Allow for this conversation". */
  scope?: string;
  requestedAt: string;
  seq: number;
}

/**
 * A tool call paused until its member enters a credential (`credential.requested`): the
 * destination origin and the path of the signed form, never a value or reference; resolved by
 * `credential.settled` (`submitted`, `cancelled` or `expired`).
 */
export interface ICredentialRequestView {
  requestId: string;
  callId: string;
  tool: string;
  origin: string;
  effect: string;
  approvalId: string | null;
  /** The form's path under the server's base URL (`kaizen/credentials/forms/<token>`). */
  formPath: string;
  expiresAt: string;
  status?: string;
  seq: number;
}

export interface IUsage {
  prompt_tokens?: number;
  completion_tokens?: number;
  total_tokens?: number;
  cost?: number | null;
}

export interface IAnswerView {
  step: number;
  text: string;
  /** False while live deltas stream; true once `answer.committed` replaced them. */
  committed: boolean;
  model?: string;
  usage?: IUsage;
  seq?: number;
}

export interface ITerminalView {
  status: string;
  reason: string;
  message?: string;
  at: string;
}

export interface IRunView {
  runId: string;
  /** Seq of the first event of this run: the display order. */
  seq: number;
  input?: IInputView;
  status: RunStatus;
  admitted: boolean;
  model?: string;
  agentId?: string;
  agentVersion?: string | number;
  step: number;
  startedAt?: string;
  tools: IToolCallView[];
  approvals: IApprovalView[];
  /** Calls paused for a credential form (absent before the first one). */
  credentials?: ICredentialRequestView[];
  answers: IAnswerView[];
  /** Live `thinking.delta` text of the step streaming now; never stored, gone at the end. */
  thinking?: string;
  terminal?: ITerminalView;
}

export interface INoteView {
  seq: number;
  text: string;
  at: string;
}

export interface IConversationState {
  conversationId: string;
  /** The highest durable seq applied. Resume from here (`?after=lastSeq`). */
  lastSeq: number;
  runs: Readonly<Record<string, IRunView>>;
  /** Run ids in order of their first event. */
  runOrder: readonly string[];
  notes: readonly INoteView[];
  /** The last answer committed while live (for the aria-live region), or null. */
  announcement: { seq: number; text: string } | null;
  /**
   * Seq of the last event that may have changed this conversation's artifacts (an
   * `artifact.version`, or an artifact-writing tool settled); 0 when none. The artifacts pane
   * refreshes when it moves.
   */
  artifactSeq: number;
  /** Attached notebooks, kernel access and notebook edit proposals (notebook/edits.ts). */
  notebook: INotebookState;
}

export function initialState(conversationId: string): IConversationState {
  return {
    conversationId,
    lastSeq: 0,
    runs: {},
    runOrder: [],
    notes: [],
    announcement: null,
    artifactSeq: 0,
    notebook: EMPTY_NOTEBOOK_STATE
  };
}

export interface IApplyOptions {
  /** Frames from the live socket (not history): committed answers are announced. */
  announce?: boolean;
}

/** Apply frames in order. Returns the same object when nothing changed. */
export function applyFrames(
  state: IConversationState,
  frames: readonly Frame[],
  options: IApplyOptions = {}
): IConversationState {
  let next = state;
  for (const frame of frames) {
    next = applyFrame(next, frame, options);
  }
  return next;
}

/** Apply one frame. Returns the same object when nothing changed (e.g. a duplicate). */
export function applyFrame(
  state: IConversationState,
  frame: Frame,
  options: IApplyOptions = {}
): IConversationState {
  if (frame.conversation_id && frame.conversation_id !== state.conversationId) {
    return state;
  }
  if (frame.live) {
    return applyLive(state, frame);
  }
  if (frame.seq <= state.lastSeq) {
    return state; // duplicate: already applied
  }
  const next = applyDurable(state, frame, options);
  return next === state ? { ...state, lastSeq: frame.seq } : { ...next, lastSeq: frame.seq };
}

// -- durable events ---------------------------------------------------------------------------

function applyDurable(
  state: IConversationState,
  event: IJournalEvent,
  options: IApplyOptions
): IConversationState {
  const d = event.data;
  switch (event.type) {
    case 'input.accepted':
    case 'steering.accepted': {
      if (!event.run_id) {
        return state;
      }
      const kind =
        event.type === 'steering.accepted' || str(d, 'kind') === 'steering' ? 'steering' : 'message';
      return updateRun(state, event, run => ({
        ...run,
        input: {
          inputId: str(d, 'input_id'),
          position: num(d, 'position'),
          text: str(d, 'text'),
          kind,
          member: event.actor,
          at: event.at,
          seq: event.seq
        }
      }));
    }
    case 'run.admitted':
      return updateRun(state, event, run => ({
        ...run,
        admitted: true,
        status: isTerminal(run) ? run.status : 'running',
        model: str(d, 'model') || run.model,
        agentId: str(d, 'agent_id') || run.agentId,
        agentVersion:
          typeof d.agent_version === 'string' || typeof d.agent_version === 'number'
            ? d.agent_version
            : run.agentVersion,
        startedAt: event.at
      }));
    case 'model.step.started':
      return updateRun(state, event, run => {
        const step = num(d, 'step', run.step + 1);
        // A retried attempt of a step restarts its live text.
        const answers = run.answers.filter(a => a.committed || a.step !== step);
        return {
          ...run,
          admitted: true,
          step,
          status: isTerminal(run) || run.status === 'awaiting_approval' ? run.status : 'running',
          answers: answers.length === run.answers.length ? run.answers : answers,
          // Thinking is live only and belongs to the step streaming now.
          thinking: undefined
        };
      });
    case 'answer.committed': {
      const step = num(d, 'step', 0);
      const answer: IAnswerView = {
        step,
        text: str(d, 'text'),
        committed: true,
        model: str(d, 'model') || undefined,
        usage: parseUsage(d.usage),
        seq: event.seq
      };
      const next = updateRun(state, event, run => ({
        ...run,
        answers: replaceAnswer(run.answers, answer)
      }));
      return options.announce && answer.text
        ? { ...next, announcement: { seq: event.seq, text: answer.text } }
        : next;
    }
    case 'tool.requested':
      return updateRun(state, event, run => {
        const callId = str(d, 'call_id') || `seq-${event.seq}`;
        if (run.tools.some(t => t.callId === callId)) {
          return run;
        }
        const call: IToolCallView = {
          callId,
          name: str(d, 'name', 'tool'),
          step: num(d, 'step'),
          capability: str(d, 'capability'),
          arguments: 'arguments' in d ? d.arguments : undefined,
          ...('placeholders' in d ? { placeholders: d.placeholders } : {}),
          requestedAt: event.at,
          seq: event.seq
        };
        return { ...run, tools: [...run.tools, call] };
      });
    case 'artifact.version':
      return { ...state, artifactSeq: event.seq };
    case 'tool.settled': {
      const settledState = updateRun(state, event, run => {
        const callId = str(d, 'call_id') || `seq-${event.seq}`;
        const index = run.tools.findIndex(t => t.callId === callId);
        const base: IToolCallView =
          index >= 0
            ? run.tools[index]
            : {
                callId,
                name: str(d, 'name', 'tool'),
                step: num(d, 'step'),
                capability: '',
                requestedAt: event.at,
                seq: event.seq
              };
        const settled: IToolCallView = {
          ...base,
          name: str(d, 'name') || base.name,
          capability: str(d, 'capability') || base.capability,
          outcome: str(d, 'outcome', 'ok'),
          content: d.content,
          arguments: 'arguments' in d ? d.arguments : base.arguments,
          ...('files' in d ? { files: d.files } : {}),
          ...('canvas' in d ? { canvas: d.canvas } : {}),
          ...(d.canvas_dropped === true ? { canvasDropped: true } : {}),
          settledAt: event.at
        };
        const tools =
          index >= 0
            ? run.tools.map((t, i) => (i === index ? settled : t))
            : [...run.tools, settled];
        return { ...run, tools };
      });
      // The settled event may omit the name: the requested call carries it.
      const callId = str(d, 'call_id') || `seq-${event.seq}`;
      const settledRun = event.run_id ? settledState.runs[event.run_id] : undefined;
      const name = str(d, 'name') || (settledRun?.tools.find(t => t.callId === callId)?.name ?? '');
      return mayWriteArtifacts(name) ? { ...settledState, artifactSeq: event.seq } : settledState;
    }
    case 'approval.requested':
      return updateRun(state, event, run => {
        const approval: IApprovalView = {
          approvalId: str(d, 'approval_id') || `seq-${event.seq}`,
          tool: str(d, 'tool', 'tool'),
          capability: str(d, 'capability'),
          arguments: d.arguments,
          argsDigest: str(d, 'args_digest'),
          requestedAt: event.at,
          seq: event.seq
        };
        if (run.approvals.some(a => a.approvalId === approval.approvalId)) {
          return run;
        }
        // The call waiting for this decision learns its capability from the request.
        let marked = false;
        const tools = [...run.tools].reverse().map(t => {
          if (!marked && t.outcome === undefined && t.name === approval.tool && !t.capability) {
            marked = true;
            return { ...t, capability: approval.capability };
          }
          return t;
        }).reverse();
        return {
          ...run,
          status: isTerminal(run) ? run.status : 'awaiting_approval',
          approvals: [...run.approvals, approval],
          tools: marked ? tools : run.tools
        };
      });
    case 'approval.decided':
      return updateRun(state, event, run => {
        const id = str(d, 'approval_id');
        const decision = normalizeDecision(str(d, 'decision'));
        const scope = str(d, 'scope') || undefined;
        const approvals = run.approvals.map(a =>
          a.approvalId === id ? { ...a, decision, decidedBy: event.actor, scope } : a
        );
        const stillPending = approvals.some(a => !a.decision);
        return {
          ...run,
          approvals,
          status: isTerminal(run) ? run.status : stillPending ? 'awaiting_approval' : 'running'
        };
      });
    case 'credential.requested':
      return updateRun(state, event, run => {
        const request: ICredentialRequestView = {
          requestId: str(d, 'request_id') || `seq-${event.seq}`,
          callId: str(d, 'call_id'),
          tool: str(d, 'tool', 'tool'),
          origin: str(d, 'origin'),
          effect: str(d, 'effect'),
          approvalId: str(d, 'approval_id') || null,
          formPath: str(d, 'form_path'),
          expiresAt: str(d, 'expires_at'),
          seq: event.seq
        };
        const known = run.credentials ?? [];
        if (known.some(c => c.requestId === request.requestId)) {
          return run;
        }
        return {
          ...run,
          status: isTerminal(run) ? run.status : 'awaiting_approval',
          credentials: [...known, request]
        };
      });
    case 'credential.settled':
      return updateRun(state, event, run => {
        const id = str(d, 'request_id');
        const status = str(d, 'status', 'cancelled');
        const credentials = (run.credentials ?? []).map(c =>
          c.requestId === id ? { ...c, status } : c
        );
        const stillPending =
          credentials.some(c => !c.status) || run.approvals.some(a => !a.decision);
        return {
          ...run,
          credentials,
          status: isTerminal(run) ? run.status : stillPending ? 'awaiting_approval' : 'running'
        };
      });
    case 'run.terminal':
      return updateRun(state, event, run => {
        const status = str(d, 'status', 'failed');
        return {
          ...run,
          status: (TERMINAL_STATUSES.has(status) ? status : 'failed') as RunStatus,
          terminal: {
            status,
            reason: str(d, 'reason'),
            message: str(d, 'message') || undefined,
            at: event.at
          },
          // Live text never committed is dropped with the run's end.
          answers: run.answers.filter(a => a.committed),
          thinking: undefined
        };
      });
    case 'participant.added':
    case 'participant.removed': {
      const who = str(d, 'member', 'A member');
      const verb = event.type === 'participant.added' ? 'joined' : 'left';
      return {
        ...state,
        notes: [...state.notes, { seq: event.seq, text: `${who} ${verb} the conversation.`, at: event.at }]
      };
    }
    default:
      if (event.type.startsWith('notebook.')) {
        const notebook = applyNotebookEvent(state.notebook, event);
        return notebook === state.notebook ? state : { ...state, notebook };
      }
      return state; // unknown types only advance lastSeq
  }
}

function normalizeDecision(value: string): string {
  if (value === 'approve') {
    return 'approved';
  }
  if (value === 'deny') {
    return 'denied';
  }
  return value || 'decided';
}

function replaceAnswer(answers: IAnswerView[], answer: IAnswerView): IAnswerView[] {
  const index = answers.findIndex(a => a.step === answer.step);
  if (index < 0) {
    return [...answers, answer];
  }
  return answers.map((a, i) => (i === index ? answer : a));
}

/** The live thinking text kept per run (its latest part). */
export const MAX_THINKING_CHARS = 20000;

// -- live frames ------------------------------------------------------------------------------

function applyLive(state: IConversationState, frame: ILiveFrame): IConversationState {
  if (!frame.run_id || !(frame.run_id in state.runs)) {
    // A delta for a run not seen yet (its admission is still on the way): nothing to attach
    // to; the committed answer carries the whole text anyway.
    return state;
  }
  const run = state.runs[frame.run_id];
  if (isTerminal(run)) {
    return state;
  }
  const text = str(frame.data, 'text');
  if (!text) {
    return state;
  }
  if (frame.type === 'answer.delta') {
    const step = num(frame.data, 'step', run.step);
    const index = run.answers.findIndex(a => a.step === step);
    if (index >= 0 && run.answers[index].committed) {
      return state; // late delta after the commit: the commit wins
    }
    const answers =
      index >= 0
        ? run.answers.map((a, i) => (i === index ? { ...a, text: a.text + text } : a))
        : [...run.answers, { step, text, committed: false }];
    return withRun(state, { ...run, answers });
  }
  if (frame.type === 'thinking.delta') {
    // Bounded: a long reasoning stream keeps its latest part only.
    const thinking = ((run.thinking ?? '') + text).slice(-MAX_THINKING_CHARS);
    return withRun(state, { ...run, thinking });
  }
  return state;
}

// -- helpers ----------------------------------------------------------------------------------

function newRun(runId: string, seq: number): IRunView {
  return {
    runId,
    seq,
    status: 'queued',
    admitted: false,
    step: 0,
    tools: [],
    approvals: [],
    answers: []
  };
}

function updateRun(
  state: IConversationState,
  event: IJournalEvent,
  change: (run: IRunView) => IRunView
): IConversationState {
  if (!event.run_id) {
    return state;
  }
  const existing = state.runs[event.run_id];
  const run = existing ?? newRun(event.run_id, event.seq);
  const changed = change(run);
  if (existing && changed === existing) {
    return state;
  }
  return withRun(state, changed, !existing);
}

function withRun(state: IConversationState, run: IRunView, isNew = false): IConversationState {
  return {
    ...state,
    runs: { ...state.runs, [run.runId]: run },
    runOrder: isNew ? [...state.runOrder, run.runId] : state.runOrder
  };
}

export function isTerminal(run: IRunView): boolean {
  return run.terminal !== undefined;
}

/** The usage block of `answer.committed`, keeping only finite non-negative numbers. */
export function parseUsage(value: unknown): IUsage | undefined {
  if (!isRecord(value)) {
    return undefined;
  }
  const count = (key: string): number | undefined => {
    const v = value[key];
    return typeof v === 'number' && Number.isFinite(v) && v >= 0 ? v : undefined;
  };
  const usage: IUsage = {};
  const prompt = count('prompt_tokens');
  const completion = count('completion_tokens');
  const total = count('total_tokens');
  const cost = count('cost');
  if (prompt !== undefined) {
    usage.prompt_tokens = prompt;
  }
  if (completion !== undefined) {
    usage.completion_tokens = completion;
  }
  if (total !== undefined) {
    usage.total_tokens = total;
  } else if (prompt !== undefined || completion !== undefined) {
    usage.total_tokens = (prompt ?? 0) + (completion ?? 0);
  }
  usage.cost = cost ?? null;
  return usage.total_tokens === undefined && usage.cost === null ? undefined : usage;
}

// -- derived views ----------------------------------------------------------------------------

/** Runs accepted but not yet admitted nor ended, in input order: the visible queue. */
export function queuedRuns(state: IConversationState): IRunView[] {
  return state.runOrder
    .map(id => state.runs[id])
    .filter(run => !run.admitted && !isTerminal(run))
    .sort((a, b) => (a.input?.position ?? a.seq) - (b.input?.position ?? b.seq));
}

/** The run being worked on now (admitted, not ended), or null. */
export function activeRun(state: IConversationState): IRunView | null {
  for (let i = state.runOrder.length - 1; i >= 0; i--) {
    const run = state.runs[state.runOrder[i]];
    if (run.admitted && !isTerminal(run)) {
      return run;
    }
  }
  return null;
}

/** True while something runs or waits: new messages queue, steering is offered. */
export function isBusy(state: IConversationState): boolean {
  return activeRun(state) !== null || queuedRuns(state).length > 0;
}

/** Runs shown in the transcript (admitted or ended), in order of their first event. */
export function transcriptRuns(state: IConversationState): IRunView[] {
  return state.runOrder
    .map(id => state.runs[id])
    .filter(run => run.admitted || isTerminal(run));
}

/** Milliseconds between two ISO timestamps, or null when either is unreadable. */
export function durationMs(from: string | undefined, to: string | undefined): number | null {
  if (!from || !to) {
    return null;
  }
  const a = Date.parse(from);
  const b = Date.parse(to);
  return Number.isFinite(a) && Number.isFinite(b) ? Math.max(0, b - a) : null;
}

/** A short human duration: `850 ms`, `2.4 s`, `1 min 5 s`. */
export function formatDuration(ms: number): string {
  if (ms < 1000) {
    return `${Math.round(ms)} ms`;
  }
  if (ms < 60000) {
    return `${(ms / 1000).toFixed(1)} s`;
  }
  const minutes = Math.floor(ms / 60000);
  const seconds = Math.round((ms % 60000) / 1000);
  return `${minutes} min ${seconds} s`;
}

/**
 * A bounded, readable rendering of tool arguments or results: pretty JSON (strings that hold
 * JSON are parsed first), cut at `limit` characters with a marker.
 */
export function boundedText(value: unknown, limit = 4000): { text: string; truncated: boolean } {
  let text: string;
  if (value === undefined || value === null) {
    text = '';
  } else if (typeof value === 'string') {
    text = value;
    const trimmed = value.trim();
    if (trimmed.startsWith('{') || trimmed.startsWith('[')) {
      try {
        text = JSON.stringify(JSON.parse(trimmed), null, 2);
      } catch {
        text = value;
      }
    }
  } else {
    try {
      text = JSON.stringify(value, null, 2) ?? String(value);
    } catch {
      text = String(value);
    }
  }
  if (text.length <= limit) {
    return { text, truncated: false };
  }
  return { text: `${text.slice(0, limit)}\n… (${text.length - limit} more characters)`, truncated: true };
}

/** `{...}` data as key/value lines for an approval card: one line per top-level key. */
export function argumentLines(value: unknown, limit = 300): Array<[string, string]> {
  if (!isRecord(value)) {
    const { text } = boundedText(value, limit);
    return text ? [['value', text]] : [];
  }
  return Object.keys(value as Data).map(key => {
    const v = (value as Data)[key];
    const text = typeof v === 'string' ? v : boundedText(v, limit).text;
    return [key, text.length > limit ? `${text.slice(0, limit)}…` : text];
  });
}

/**
 * Markdown as a sentence for a screen reader: code fences become "(code)", emphasis, heading
 * marks, link targets and HTML tags are dropped; capped at `limit` characters.
 */
export function speakable(markdown: string, limit = 1000): string {
  let text = markdown
    .replace(/```[\s\S]*?(```|$)/g, ' (code) ')
    .replace(/<[^>]*>/g, ' ')
    .replace(/!\[([^\]]*)\]\([^)]*\)/g, '$1')
    .replace(/\[([^\]]*)\]\([^)]*\)/g, '$1')
    .replace(/`([^`]*)`/g, '$1')
    .replace(/(\*\*|__|\*|_|~~)(?=\S)([\s\S]*?\S)\1/g, '$2')
    .replace(/^\s{0,3}(#{1,6}|>|[-*+]|\d+\.)\s+/gm, '')
    .replace(/\s+/g, ' ')
    .trim();
  if (text.length > limit) {
    text = `${text.slice(0, limit)}…`;
  }
  return text;
}

// -- usage ------------------------------------------------------------------------------------

export interface IUsageTotals {
  promptTokens: number;
  completionTokens: number;
  totalTokens: number;
  /** The sum of reported costs, or null when no answer reported one. */
  cost: number | null;
  /** Runs that reported usage. */
  runs: number;
}

/**
 * The usage of one run: `answer.committed` carries the run's running totals (every model
 * step so far), so the committed answer of the highest step is the run's usage.
 */
export function runUsage(run: IRunView): IUsage | undefined {
  let best: IAnswerView | undefined;
  for (const answer of run.answers) {
    if (answer.committed && answer.usage && (!best || answer.step >= best.step)) {
      best = answer;
    }
  }
  return best?.usage;
}

/** Tokens (and cost, when reported) of the whole conversation: the sum over its runs. */
export function conversationUsage(state: IConversationState): IUsageTotals {
  const totals: IUsageTotals = {
    promptTokens: 0,
    completionTokens: 0,
    totalTokens: 0,
    cost: null,
    runs: 0
  };
  for (const id of state.runOrder) {
    const usage = runUsage(state.runs[id]);
    if (!usage) {
      continue;
    }
    totals.runs += 1;
    totals.promptTokens += usage.prompt_tokens ?? 0;
    totals.completionTokens += usage.completion_tokens ?? 0;
    totals.totalTokens +=
      usage.total_tokens ?? (usage.prompt_tokens ?? 0) + (usage.completion_tokens ?? 0);
    if (typeof usage.cost === 'number') {
      totals.cost = (totals.cost ?? 0) + usage.cost;
    }
  }
  return totals;
}

/** A token count for a badge: `950`, `12,345` (grouped, locale-independent). */
export function formatTokens(n: number): string {
  return Math.round(n)
    .toString()
    .replace(/\B(?=(\d{3})+(?!\d))/g, ',');
}

/** A provider-reported cost (USD): `$0.0042`, `$1.25`. */
export function formatCost(cost: number): string {
  if (cost === 0) {
    return '$0';
  }
  if (cost < 0.01) {
    return `$${cost.toPrecision(2)}`;
  }
  return `$${cost.toFixed(2)}`;
}

/** One line for an answer or a conversation: `1,234 tokens (1,000 in, 234 out) · $0.0042`. */
export function usageSummary(usage: {
  prompt?: number;
  completion?: number;
  total?: number;
  cost?: number | null;
}): string {
  const parts: string[] = [];
  if (usage.total !== undefined) {
    const split =
      usage.prompt !== undefined || usage.completion !== undefined
        ? ` (${formatTokens(usage.prompt ?? 0)} in, ${formatTokens(usage.completion ?? 0)} out)`
        : '';
    parts.push(`${formatTokens(usage.total)} tokens${split}`);
  }
  if (typeof usage.cost === 'number') {
    parts.push(formatCost(usage.cost));
  }
  return parts.join(' · ');
}
