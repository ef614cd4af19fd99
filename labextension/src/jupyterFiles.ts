/**
 * The member's files of the Jupyter contents tree as message attachments, and artifacts saved
 * back into it. The server reads and writes through its own ContentsManager (`POST
 * kaizen/api/jupyter-files`, `POST kaizen/api/artifacts/{id}/save-to-jupyter`): the panel only
 * ever sends paths, never bytes it read.
 *
 * `@path` in the composer names a file too: `mentionedPaths` finds the tokens that look like
 * paths, `pathQuery` the one being typed (for completion), and `listFolder` the folder's entries
 * through the Jupyter contents API (names only).
 */
import { ServerConnection } from '@jupyterlab/services';

import { KaizenApi, NETWORK_FAILURE, Result } from './api';
import { isRecord } from './protocol';

/** A Jupyter file read into a version of an artifact the member owns, ready to attach. */
export interface IAttachment {
  path: string;
  artifactId: string;
  version: number;
  filename: string;
  size: number;
  mime: string;
}

export function parseAttachment(body: unknown): IAttachment | null {
  if (!isRecord(body) || typeof body.path !== 'string' || !isRecord(body.artifact)) {
    return null;
  }
  const artifact = body.artifact;
  if (typeof artifact.id !== 'string' || typeof artifact.version !== 'number') {
    return null;
  }
  return {
    path: body.path,
    artifactId: artifact.id,
    version: artifact.version,
    filename: typeof artifact.title === 'string' ? artifact.title : body.path,
    size: typeof artifact.size === 'number' ? artifact.size : 0,
    mime: typeof artifact.mime === 'string' ? artifact.mime : ''
  };
}

/** Read `path` (relative to the Jupyter root) into an attachable artifact version. */
export function readJupyterFile(api: KaizenApi, path: string): Promise<Result<IAttachment>> {
  return api.call('POST', 'jupyter-files', { path }, `attach ${path}`, parseAttachment);
}

export interface ISavedFile {
  path: string;
  overwritten: boolean;
}

/** Write one version of an artifact the member owns into the Jupyter tree. */
export function saveToJupyter(
  api: KaizenApi,
  artifactId: string,
  version: number,
  path: string,
  overwrite: boolean
): Promise<Result<ISavedFile>> {
  return api.call(
    'POST',
    `artifacts/${encodeURIComponent(artifactId)}/save-to-jupyter`,
    { path, version, overwrite },
    'save the file into the Jupyter folder',
    body =>
      isRecord(body) && typeof body.path === 'string'
        ? { path: body.path, overwritten: body.overwritten === true }
        : null
  );
}

/** The server's answer when the target exists and overwrite was not chosen. */
export const FILE_EXISTS_STATUS = 409;

// "@" at the start or after whitespace, then a path; trailing sentence punctuation is not part.
const MENTION = /(^|\s)@([^\s@]+)/;
const TRAILING = /[.,;:!?)\]}'"]+$/;

/**
 * The `@path` tokens of a message that look like files (with a `/` or a `.`), in order and
 * without repeats. `@alice` stays text.
 */
export function mentionedPaths(text: string): string[] {
  const out: string[] = [];
  const mention = new RegExp(MENTION.source, 'g');
  let match: RegExpExecArray | null;
  while ((match = mention.exec(text)) !== null) {
    const path = match[2].replace(TRAILING, '');
    if (path && (path.includes('/') || path.includes('.')) && !out.includes(path)) {
      out.push(path);
    }
  }
  return out;
}

/** The `@path` being typed just before the caret: where it starts (the `@`) and its text. */
export function pathQuery(text: string, caret: number): { start: number; query: string } | null {
  const before = text.slice(0, caret);
  const match = /(^|\s)@([^\s@]*)$/.exec(before);
  if (!match) {
    return null;
  }
  return { start: before.length - match[2].length - 1, query: match[2] };
}

export interface IFolderEntry {
  name: string;
  path: string;
  directory: boolean;
}

/** The folder part and the name prefix of a query: `data/sa` -> (`data`, `sa`). */
export function splitQuery(query: string): { folder: string; prefix: string } {
  const cut = query.lastIndexOf('/');
  return cut < 0
    ? { folder: '', prefix: query }
    : { folder: query.slice(0, cut), prefix: query.slice(cut + 1) };
}

/** Entries of a folder whose names start with `prefix` (hidden ones only when asked for). */
export function matchingEntries(entries: IFolderEntry[], prefix: string, limit = 8): IFolderEntry[] {
  const lower = prefix.toLowerCase();
  return entries
    .filter(e => e.name.toLowerCase().startsWith(lower) && (prefix.startsWith('.') || !e.name.startsWith('.')))
    .sort((a, b) => Number(b.directory) - Number(a.directory) || a.name.localeCompare(b.name))
    .slice(0, limit);
}

/** A folder's entries through the Jupyter contents API (names and kinds only). */
export async function listFolder(
  settings: ServerConnection.ISettings,
  folder: string
): Promise<Result<IFolderEntry[]>> {
  const base = settings.baseUrl.endsWith('/') ? settings.baseUrl : `${settings.baseUrl}/`;
  const encoded = folder.split('/').filter(Boolean).map(encodeURIComponent).join('/');
  let response: Response;
  try {
    response = await ServerConnection.makeRequest(
      `${base}api/contents/${encoded}?content=1&type=directory`,
      { method: 'GET' },
      settings
    );
  } catch {
    return { ok: false, message: NETWORK_FAILURE, status: 0 };
  }
  if (!response.ok) {
    return { ok: false, message: 'No such folder.', status: response.status };
  }
  const body: unknown = await response.json().catch(() => null);
  if (!isRecord(body) || !Array.isArray(body.content)) {
    return { ok: false, message: 'No such folder.', status: response.status };
  }
  const entries: IFolderEntry[] = [];
  for (const item of body.content) {
    if (isRecord(item) && typeof item.name === 'string' && typeof item.path === 'string') {
      entries.push({ name: item.name, path: item.path, directory: item.type === 'directory' });
    }
  }
  return { ok: true, value: entries };
}

/** "12 KB"-style sizes for a chip. */
export function shortSize(bytes: number): string {
  if (bytes < 1024) {
    return `${bytes} B`;
  }
  if (bytes < 1024 * 1024) {
    return `${Math.round(bytes / 102.4) / 10} KB`;
  }
  return `${Math.round(bytes / (1024 * 102.4)) / 10} MB`;
}

// The extension the download route gives a text kind (api/artifacts.py: _EXTENSIONS).
const KIND_EXTENSIONS: Record<string, string> = {
  markdown: '.md',
  html: '.html',
  svg: '.svg',
  code: '.txt',
  mermaid: '.mmd',
  react: '.jsx',
  json: '.json',
  graph: '.json'
};

/** Where "Save to Jupyter folder…" proposes to write: `folder/<title><extension>`. */
export function suggestedPath(
  folder: string,
  artifact: { title: string; kind: string; governed: boolean }
): string {
  const stem = artifact.title.replace(/[\\/\x00-\x1f]+/g, '_').replace(/^[.\s]+/, '') || 'artifact';
  const extension = artifact.governed ? '.json' : KIND_EXTENSIONS[artifact.kind] ?? '';
  const name = extension && !stem.toLowerCase().endsWith(extension) ? stem + extension : stem;
  const cleanFolder = folder.replace(/^\/+|\/+$/g, '');
  return cleanFolder ? `${cleanFolder}/${name}` : name;
}
