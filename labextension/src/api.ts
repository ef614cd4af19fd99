/**
 * The Kaizen REST API (shared API.md), through `ServerConnection.makeRequest` so the Jupyter
 * server's own token/cookie + XSRF authentication applies.
 *
 * Every call answers a `Result`: the value, or a sentence fit to show a member. Raw bodies,
 * exception text and URLs never reach the panel (they go to the console as a status line).
 */
import { ServerConnection } from '@jupyterlab/services';

import {
  attachmentName,
  IArtifact,
  IArtifactView,
  parseArtifacts,
  parseArtifactView
} from './artifacts';
import { isRecord, JournalEvent, parseEvent } from './protocol';

/** One entry of `GET kaizen/api/agents`: `[{id, name, mode, version, tools}]`. */
export interface IAgent {
  id: string;
  name: string;
  mode: string;
  version?: string | number;
  tools?: string[];
}

/** One conversation (`ConversationRecord.public()`). */
export interface IConversation {
  id: string;
  agent_id: string;
  title: string;
  shared: boolean;
  owner: string;
  audience_version: number;
  participants: string[];
  last_seq: number;
  created_at?: string;
  updated_at?: string;
  /** The room's running or approval-waiting run at the time of listing, if any. */
  active_run?: { id: string; status: string } | null;
}

/** The answer of `POST conversations/{id}/messages`. */
export interface IAccepted {
  input_id: string;
  position: number;
  run_id: string;
}

export interface IJournalPage {
  events: JournalEvent[];
  next: number;
}

export type ApprovalMode = 'always_ask' | 'ask_for_writes' | 'never_ask';
export const APPROVAL_MODES: ApprovalMode[] = ['always_ask', 'ask_for_writes', 'never_ask'];

export interface IMemberSettings {
  approval_mode: ApprovalMode;
  model: string | null;
  default_model?: string | null;
  /** The model reads run_code output compressed; the activity keeps it whole. */
  tool_result_compression: boolean;
}

export interface IMe {
  member: string;
  admin: boolean;
}

/** A value, or a member-safe sentence (and the HTTP status, 0 when unreachable). */
export type Result<T> = { ok: true; value: T } | { ok: false; message: string; status: number };

/** The REST prefix of the Kaizen server extension, under the Jupyter server's base URL. */
export const API_PREFIX = 'kaizen/api/';

const MAX_SERVER_MESSAGE = 200;

/** Join the server's base URL (always ending with '/') and a path under it. */
export function apiUrl(baseUrl: string, path: string): string {
  return (baseUrl.endsWith('/') ? baseUrl : `${baseUrl}/`) + API_PREFIX + path;
}

/** Where the signed credential forms are served, under the server's base URL. */
export const CREDENTIAL_FORM_PREFIX = 'kaizen/credentials/forms/';
const FORM_TOKEN = /^[A-Za-z0-9_-]{16,4000}\.[A-Za-z0-9_-]{16,200}$/;

/**
 * The URL of a paused call's credential form (`credential.requested` `form_path`), or null
 * for anything that is not a form path: the panel links only to its own server's form page.
 */
export function credentialFormUrl(baseUrl: string, formPath: string): string | null {
  if (!formPath.startsWith(CREDENTIAL_FORM_PREFIX)) {
    return null;
  }
  if (!FORM_TOKEN.test(formPath.slice(CREDENTIAL_FORM_PREFIX.length))) {
    return null;
  }
  return (baseUrl.endsWith('/') ? baseUrl : `${baseUrl}/`) + formPath;
}

/**
 * The sentence shown to the member when a Kaizen call fails.
 *
 * The Kaizen API answers errors with `{"error": {"code", "message"}}` where `message` is a
 * member-safe sentence; that sentence is shown when present. Otherwise (a proxy page, a
 * non-Kaizen 404, an unreadable body) a fixed sentence by status is shown.
 */
export function failureMessage(status: number, body: unknown, action = 'list the agents'): string {
  const serverMessage = kaizenErrorMessage(body);
  if (serverMessage) {
    return serverMessage;
  }
  if (status === 401 || status === 403) {
    return 'Your Jupyter session is no longer signed in. Reload the page and sign in again.';
  }
  if (status === 404) {
    return 'The Kaizen server extension is not enabled on this Jupyter server.';
  }
  if (status >= 500) {
    return `Kaizen could not ${action} right now (server error ${status}). Try again later.`;
  }
  return `Kaizen could not ${action} (error ${status}).`;
}

/** The sentence shown when the Jupyter server could not be reached at all. */
export const NETWORK_FAILURE =
  'Kaizen could not reach the Jupyter server. Check your connection and try again.';

/** The sentence shown when an answer is not the shape the contract promises. */
export const UNREADABLE = 'Kaizen answered with something it could not read.';

function kaizenErrorMessage(body: unknown): string | null {
  if (!isRecord(body) || !isRecord(body.error)) {
    return null;
  }
  const message = body.error.message;
  if (typeof message !== 'string') {
    return null;
  }
  const trimmed = message.trim();
  if (!trimmed || trimmed.length > MAX_SERVER_MESSAGE) {
    return null;
  }
  return trimmed;
}

/** Read the agent entries out of an answer body, or null when it is not an agent list. */
export function parseAgents(body: unknown): IAgent[] | null {
  // The contract is a bare JSON array; an `{agents: [...]}` envelope is accepted too.
  const items = Array.isArray(body) ? body : isRecord(body) ? body.agents : undefined;
  if (!Array.isArray(items)) {
    return null;
  }
  const agents: IAgent[] = [];
  for (const item of items) {
    if (!isRecord(item) || typeof item.name !== 'string') {
      continue;
    }
    const version = item.version;
    agents.push({
      id: typeof item.id === 'string' ? item.id : String(item.id ?? item.name),
      name: item.name,
      mode: typeof item.mode === 'string' ? item.mode : '',
      version: typeof version === 'string' || typeof version === 'number' ? version : undefined,
      tools: Array.isArray(item.tools) ? item.tools.filter(t => typeof t === 'string') : []
    });
  }
  return agents;
}

export function parseConversation(item: unknown): IConversation | null {
  if (!isRecord(item) || typeof item.id !== 'string') {
    return null;
  }
  return {
    id: item.id,
    agent_id: typeof item.agent_id === 'string' ? item.agent_id : '',
    title: typeof item.title === 'string' && item.title ? item.title : 'Conversation',
    shared: item.shared === true,
    owner: typeof item.owner === 'string' ? item.owner : '',
    audience_version: typeof item.audience_version === 'number' ? item.audience_version : 0,
    participants: Array.isArray(item.participants)
      ? item.participants.filter((p): p is string => typeof p === 'string')
      : [],
    last_seq: typeof item.last_seq === 'number' ? item.last_seq : 0,
    created_at: typeof item.created_at === 'string' ? item.created_at : undefined,
    updated_at: typeof item.updated_at === 'string' ? item.updated_at : undefined
  };
}

function parseConversations(body: unknown): IConversation[] | null {
  if (!Array.isArray(body)) {
    return null;
  }
  return body.map(parseConversation).filter((c): c is IConversation => c !== null);
}

function parseJournalPage(body: unknown): IJournalPage | null {
  if (!isRecord(body) || !Array.isArray(body.events) || typeof body.next !== 'number') {
    return null;
  }
  const events = body.events.map(parseEvent).filter((e): e is JournalEvent => e !== null);
  return { events, next: body.next };
}

function parseAccepted(body: unknown): IAccepted | null {
  if (!isRecord(body) || typeof body.input_id !== 'string' || typeof body.run_id !== 'string') {
    return null;
  }
  return {
    input_id: body.input_id,
    run_id: body.run_id,
    position: typeof body.position === 'number' ? body.position : 0
  };
}

function parseSettings(body: unknown): IMemberSettings | null {
  if (!isRecord(body) || !APPROVAL_MODES.includes(body.approval_mode as ApprovalMode)) {
    return null;
  }
  return {
    approval_mode: body.approval_mode as ApprovalMode,
    model: typeof body.model === 'string' ? body.model : null,
    default_model: typeof body.default_model === 'string' ? body.default_model : null,
    tool_result_compression: body.tool_result_compression === true
  };
}

function parseMe(body: unknown): IMe | null {
  if (!isRecord(body) || typeof body.member !== 'string') {
    return null;
  }
  return { member: body.member, admin: body.admin === true };
}

/** A pending approval request (`GET approvals?status=pending`). */
export interface IApprovalRequest {
  id: string;
  run_id: string;
  conversation_id: string;
  tool: string;
  capability: string;
  arguments: unknown;
  args_digest: string;
  status: string;
}

function parseApprovals(body: unknown): IApprovalRequest[] | null {
  if (!Array.isArray(body)) {
    return null;
  }
  const out: IApprovalRequest[] = [];
  for (const item of body) {
    if (!isRecord(item) || typeof item.id !== 'string') {
      continue;
    }
    out.push({
      id: item.id,
      run_id: String(item.run_id ?? ''),
      conversation_id: String(item.conversation_id ?? ''),
      tool: String(item.tool ?? ''),
      capability: String(item.capability ?? ''),
      arguments: item.arguments,
      args_digest: String(item.args_digest ?? ''),
      status: String(item.status ?? '')
    });
  }
  return out;
}

/** One of the member's own live persistent run_code kernels in a conversation. */
export interface IPersistentKernel {
  language: string;
  kernel_name: string;
  /** A run_code call holds it right now. */
  busy: boolean;
  /** Its id in the Jupyter kernels API once opened as a console, else null. */
  console_kernel_id: string | null;
}

/** `GET conversations/{id}/kernel`: the caller's kernels there, and whether consoles may attach. */
export interface IConversationKernel {
  console_enabled: boolean;
  kernels: IPersistentKernel[];
}

/** `POST conversations/{id}/kernel/console`: the kernel to attach JupyterLab's console to. */
export interface IConsoleKernel {
  kernel_id: string;
  kernel_name: string;
  language: string;
}

export function parseConversationKernel(body: unknown): IConversationKernel | null {
  if (!isRecord(body) || !Array.isArray(body.kernels)) {
    return null;
  }
  const kernels: IPersistentKernel[] = [];
  for (const item of body.kernels) {
    if (!isRecord(item) || typeof item.language !== 'string') {
      continue;
    }
    kernels.push({
      language: item.language,
      kernel_name: typeof item.kernel_name === 'string' ? item.kernel_name : '',
      busy: item.busy === true,
      console_kernel_id:
        typeof item.console_kernel_id === 'string' ? item.console_kernel_id : null
    });
  }
  return { console_enabled: body.console_enabled === true, kernels };
}

/** Jupyter kernel ids are UUIDs; anything else is not handed to JupyterLab. */
const KERNEL_ID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;

export function parseConsoleKernel(body: unknown): IConsoleKernel | null {
  if (!isRecord(body) || typeof body.kernel_id !== 'string' || !KERNEL_ID.test(body.kernel_id)) {
    return null;
  }
  return {
    kernel_id: body.kernel_id,
    kernel_name: typeof body.kernel_name === 'string' ? body.kernel_name : '',
    language: typeof body.language === 'string' ? body.language : ''
  };
}

/**
 * The REST client: one instance per panel, bound to the server settings.
 */
export class KaizenApi {
  constructor(readonly settings: ServerConnection.ISettings = ServerConnection.makeSettings()) {}

  agents(): Promise<Result<IAgent[]>> {
    return this._call('GET', 'agents', undefined, 'list the agents', parseAgents);
  }

  me(): Promise<Result<IMe>> {
    return this._call('GET', 'members/me', undefined, 'identify you', parseMe);
  }

  conversations(): Promise<Result<IConversation[]>> {
    return this._call(
      'GET',
      'conversations',
      undefined,
      'list your conversations',
      parseConversations
    );
  }

  createConversation(body: {
    agent_id: string;
    title?: string;
    shared?: boolean;
  }): Promise<Result<IConversation>> {
    return this._call(
      'POST',
      'conversations',
      body,
      'start a conversation',
      parseConversation
    );
  }

  postMessage(
    conversationId: string,
    body: {
      text: string;
      kind: 'message' | 'steering';
      idempotency_key: string;
      /** Artifact ids to pin to the message (its attached files). */
      attachments?: string[];
    }
  ): Promise<Result<IAccepted>> {
    return this._call(
      'POST',
      `conversations/${encodeURIComponent(conversationId)}/messages`,
      body,
      'send your message',
      parseAccepted
    );
  }

  journal(conversationId: string, after: number, limit = 200): Promise<Result<IJournalPage>> {
    return this._call(
      'GET',
      `conversations/${encodeURIComponent(conversationId)}/journal?after=${after}&limit=${limit}`,
      undefined,
      'load the conversation',
      parseJournalPage
    );
  }

  cancelRun(runId: string): Promise<Result<unknown>> {
    return this._call(
      'POST',
      `runs/${encodeURIComponent(runId)}/cancel`,
      {},
      'stop the run',
      body => body
    );
  }

  /** Decline the credential a paused call asks for: the call settles as refused. */
  cancelCredentialRequest(requestId: string): Promise<Result<unknown>> {
    return this._call(
      'POST',
      `credentials/requests/${encodeURIComponent(requestId)}/cancel`,
      {},
      'cancel the credential request',
      body => body
    );
  }

  pendingApprovals(): Promise<Result<IApprovalRequest[]>> {
    return this._call(
      'GET',
      'approvals?status=pending',
      undefined,
      'list the approval requests',
      parseApprovals
    );
  }

  /**
   * Decide a request once. `scope: 'conversation'` (with approve) also allows the tool for the
   * rest of this conversation, for this member ("Allow for this conversation").
   */
  decideApproval(
    approvalId: string,
    decision: 'approve' | 'deny',
    scope: 'call' | 'conversation' = 'call'
  ): Promise<Result<unknown>> {
    return this._call(
      'POST',
      `approvals/${encodeURIComponent(approvalId)}`,
      scope === 'call' ? { decision } : { decision, scope },
      'record your decision',
      body => body
    );
  }

  /**
   * Mark read the completion notices of exactly the destination this client has open
   * the server matches kind and ids by equality, never by prefix or pattern.
   */
  acknowledgeOpen(destination: {
    kind: 'chat';
    resource_id: string;
    run_id?: string;
  }): Promise<Result<unknown>> {
    return this._call(
      'POST',
      'notifications/ack',
      destination,
      'mark the notices of this conversation read',
      body => body
    );
  }

  memberSettings(): Promise<Result<IMemberSettings>> {
    return this._call('GET', 'members/me/settings', undefined, 'read your settings', parseSettings);
  }

  /** Replace the member's settings: send every field, or an omitted one is reset. */
  putMemberSettings(body: {
    approval_mode: ApprovalMode;
    model?: string | null;
    tool_result_compression?: boolean;
  }): Promise<Result<IMemberSettings>> {
    const payload: Record<string, unknown> = {
      approval_mode: body.approval_mode,
      tool_result_compression: body.tool_result_compression === true
    };
    if (body.model) {
      payload.model = body.model;
    }
    return this._call(
      'PUT',
      'members/me/settings',
      payload,
      'save your settings',
      parseSettings
    );
  }

  /** The member's own persistent run_code kernels in a conversation. */
  conversationKernel(conversationId: string): Promise<Result<IConversationKernel>> {
    return this._call(
      'GET',
      `conversations/${encodeURIComponent(conversationId)}/kernel`,
      undefined,
      "check this conversation's kernel",
      parseConversationKernel
    );
  }

  /** Make the member's persistent kernel reachable by JupyterLab; answers its kernel id. */
  openKernelConsole(conversationId: string, language = 'python'): Promise<Result<IConsoleKernel>> {
    return this._call(
      'POST',
      `conversations/${encodeURIComponent(conversationId)}/kernel/console`,
      { language },
      'open the kernel console',
      parseConsoleKernel
    );
  }

  /** The artifacts bound to a conversation (latest visible version each, no content). */
  artifacts(conversationId: string): Promise<Result<IArtifact[]>> {
    return this._call(
      'GET',
      `artifacts?conversation_id=${encodeURIComponent(conversationId)}`,
      undefined,
      "list this conversation's artifacts",
      parseArtifacts
    );
  }

  /** One version with its content (the latest visible one when `version` is null). */
  artifact(
    artifactId: string,
    version: number | null,
    conversationId: string
  ): Promise<Result<IArtifactView>> {
    return this._call(
      'GET',
      artifactPath(artifactId, version, '', conversationId),
      undefined,
      'open the artifact',
      parseArtifactView
    );
  }

  /** The exact stored bytes of a version (the download route), with the server's file name. */
  async downloadArtifact(
    artifactId: string,
    version: number | null,
    conversationId: string
  ): Promise<Result<{ blob: Blob; filename: string }>> {
    const path = artifactPath(artifactId, version, '/download', conversationId);
    let response: Response;
    try {
      response = await ServerConnection.makeRequest(
        apiUrl(this.settings.baseUrl, path),
        { method: 'GET' },
        this.settings
      );
    } catch (reason) {
      console.warn('Kaizen: an artifact download did not reach the server', reason);
      return { ok: false, message: NETWORK_FAILURE, status: 0 };
    }
    if (!response.ok) {
      let parsed: unknown = null;
      try {
        parsed = await response.json();
      } catch {
        parsed = null;
      }
      console.warn(`Kaizen: an artifact download answered ${response.status}`);
      return {
        ok: false,
        message: failureMessage(response.status, parsed, 'download the artifact'),
        status: response.status
      };
    }
    const blob = await response.blob();
    return {
      ok: true,
      value: { blob, filename: attachmentName(response.headers.get('Content-Disposition'), 'artifact') }
    };
  }

  /** The websocket URL of a conversation's events, resuming after `after`. */
  eventsUrl(conversationId: string, after: number): string {
    const base = this.settings.wsUrl.endsWith('/') ? this.settings.wsUrl : `${this.settings.wsUrl}/`;
    let url =
      `${base}${API_PREFIX}conversations/${encodeURIComponent(conversationId)}/events` +
      `?after=${after}`;
    if (this.settings.appendToken && this.settings.token) {
      url += `&token=${encodeURIComponent(this.settings.token)}`;
    }
    return url;
  }

  /** Any Kaizen route under the API prefix, with the same authentication and member-safe
   * failures (for the feature modules: notebooks, jupyterFiles, grants). */
  call<T>(
    method: string,
    path: string,
    body: unknown,
    action: string,
    parse: (body: unknown) => T | null
  ): Promise<Result<T>> {
    return this._call(method, path, body, action, parse);
  }

  private async _call<T>(
    method: string,
    path: string,
    body: unknown,
    action: string,
    parse: (body: unknown) => T | null
  ): Promise<Result<T>> {
    const init: RequestInit = { method, headers: { Accept: 'application/json' } };
    if (body !== undefined) {
      init.body = JSON.stringify(body);
      (init.headers as Record<string, string>)['Content-Type'] = 'application/json';
    }
    let response: Response;
    try {
      response = await ServerConnection.makeRequest(
        apiUrl(this.settings.baseUrl, path),
        init,
        this.settings
      );
    } catch (reason) {
      console.warn(`Kaizen: ${method} ${path.split('?')[0]} did not reach the server`, reason);
      return { ok: false, message: NETWORK_FAILURE, status: 0 };
    }
    let parsed: unknown = null;
    try {
      parsed = await response.json();
    } catch {
      parsed = null;
    }
    if (!response.ok) {
      console.warn(`Kaizen: ${method} ${path.split('?')[0]} answered ${response.status}`);
      return {
        ok: false,
        message: failureMessage(response.status, parsed, action),
        status: response.status
      };
    }
    const value = parse(parsed);
    if (value === null) {
      return { ok: false, message: UNREADABLE, status: response.status };
    }
    return { ok: true, value };
  }
}

/** `artifacts/{id}[/versions/{n}]{suffix}?conversation_id=…` (the room narrows what is read). */
export function artifactPath(
  artifactId: string,
  version: number | null,
  suffix: '' | '/download',
  conversationId: string
): string {
  const versionPart = version === null ? '' : `/versions/${version}`;
  return (
    `artifacts/${encodeURIComponent(artifactId)}${versionPart}${suffix}` +
    `?conversation_id=${encodeURIComponent(conversationId)}`
  );
}

/** A fresh idempotency key (one per composed message; a retry re-uses it). */
export function newIdempotencyKey(): string {
  const c = (globalThis as { crypto?: Crypto }).crypto;
  if (c && typeof c.randomUUID === 'function') {
    return c.randomUUID();
  }
  return `k-${Date.now().toString(36)}-${Math.random().toString(36).slice(2, 12)}`;
}
