import { ServerConnection } from '@jupyterlab/services';

/** One entry of `GET kaizen/api/agents` (see shared API.md): `[{id, name, mode, version, tools}]`. */
export interface IAgent {
  id: string;
  name: string;
  mode: string;
  version?: string | number;
}

/** The outcome of loading the agent roster: the agents, or a sentence fit to show a member. */
export type AgentsResult = { ok: true; agents: IAgent[] } | { ok: false; message: string };

/** The REST prefix of the Kaizen server extension, under the Jupyter server's base URL. */
export const API_PREFIX = 'kaizen/api/';

const MAX_SERVER_MESSAGE = 200;

/** Join the server's base URL (always ending with '/') and a path under it. */
export function apiUrl(baseUrl: string, path: string): string {
  return (baseUrl.endsWith('/') ? baseUrl : `${baseUrl}/`) + API_PREFIX + path;
}

/**
 * The sentence shown to the member when a Kaizen call fails.
 *
 * The Kaizen API answers errors with `{"error": {"code", "message"}}` where `message` is a
 * member-safe sentence; that sentence is shown when present. Otherwise (a proxy page, a
 * non-Kaizen 404, an unreadable body) a fixed sentence by status is shown: raw bodies,
 * exception text and URLs never reach the panel.
 */
export function failureMessage(status: number, body: unknown): string {
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
    return `Kaizen could not list the agents right now (server error ${status}). Try again later.`;
  }
  return `Kaizen could not list the agents (error ${status}).`;
}

/** The sentence shown when the Jupyter server could not be reached at all. */
export const NETWORK_FAILURE =
  'Kaizen could not reach the Jupyter server. Check your connection and try again.';

/** The sentence shown when the answer was not the agent list the contract promises. */
export const UNREADABLE_ANSWER = 'Kaizen answered with an agent list it could not read.';

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

function isRecord(value: unknown): value is Record<string, unknown> {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
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
      version: typeof version === 'string' || typeof version === 'number' ? version : undefined
    });
  }
  return agents;
}

/** `GET {baseUrl}kaizen/api/agents` with the Jupyter server's own authentication. */
export async function fetchAgents(
  settings: ServerConnection.ISettings = ServerConnection.makeSettings()
): Promise<AgentsResult> {
  let response: Response;
  try {
    response = await ServerConnection.makeRequest(
      apiUrl(settings.baseUrl, 'agents'),
      { method: 'GET', headers: { Accept: 'application/json' } },
      settings
    );
  } catch (reason) {
    console.warn('Kaizen: GET agents did not reach the server', reason);
    return { ok: false, message: NETWORK_FAILURE };
  }

  let body: unknown = null;
  try {
    body = await response.json();
  } catch {
    body = null;
  }

  if (!response.ok) {
    console.warn(`Kaizen: GET agents answered ${response.status}`);
    return { ok: false, message: failureMessage(response.status, body) };
  }
  const agents = parseAgents(body);
  if (agents === null) {
    return { ok: false, message: UNREADABLE_ANSWER };
  }
  return { ok: true, agents };
}
