/**
 * The member's documents from JupyterLab, and citations as links (docs/retrieval.md).
 *
 * "Add to Kaizen documents" sends only a path (`POST kaizen/api/jupyter-documents`): the server
 * reads the file through its ContentsManager as the member, so the panel never uploads bytes it
 * read. Adding the same path again makes the next version of the same document.
 *
 * An answer cites a retrieved passage as `[label](kaizen:document/<id>/v<n>#chunk=<chunk id>)`
 * (the server removed every citation its turn did not retrieve before publishing it). JupyterLab's
 * sanitizer drops hrefs of unknown schemes, so before rendering such a target becomes a fragment
 * (`#kaizen-citation/<id>/<n>/<chunk id>`), and after rendering the anchor is rebuilt as a link
 * that opens the cited version's passages (`GET documents/{id}/versions/{n}/passages`) with the
 * cited one in view.
 */
import React from 'react';

import { KaizenApi, Result } from './api';
import { isRecord } from './protocol';

/** One cited passage: which document, which exact version, which chunk. */
export interface ICitation {
  documentId: string;
  version: number;
  chunkId: string;
}

// The server's ids (api/params.py ID) and chunk ids (hex): anything else is not a citation.
const ID = '[A-Za-z0-9][A-Za-z0-9_.-]{0,127}';
const CHUNK = '[A-Za-z0-9_-]{1,64}';
const VERSION = '[1-9][0-9]{0,8}';
const CITED_TARGET = new RegExp(`\\]\\(kaizen:document/(${ID})/v(${VERSION})#chunk=(${CHUNK})\\)`, 'g');
const FRAGMENT = new RegExp(`^#kaizen-citation/(${ID})/(${VERSION})/(${CHUNK})$`);
const CITATION_CLASS = 'jp-Kaizen-citation';

/** The Markdown with each document citation's target written as a fragment that survives
 * the sanitizer; nothing else changes. */
export function linkCitations(markdown: string): string {
  return markdown.replace(CITED_TARGET, (_all, id: string, version: string, chunk: string) =>
    `](#kaizen-citation/${id}/${version}/${chunk})`
  );
}

/** The citation a rewritten href names, or null. */
export function citationOfHref(href: string): ICitation | null {
  const match = FRAGMENT.exec(href);
  if (!match) {
    return null;
  }
  return { documentId: match[1], version: Number(match[2]), chunkId: match[3] };
}

/** Opens a cited passage (a main-area view); given by the JupyterLab plugin. */
export type CitationOpener = (citation: ICitation, label: string) => void;

export const CitationContext = React.createContext<CitationOpener | null>(null);

/**
 * Each rendered citation anchor becomes a link opening the passage. The anchor is replaced by
 * a fresh one, so the renderer's own fragment handler (scroll to an element id) is not kept.
 */
export function decorateCitations(root: HTMLElement, open: CitationOpener): number {
  let count = 0;
  for (const anchor of Array.from(root.querySelectorAll('a[href^="#kaizen-citation/"]'))) {
    const citation = citationOfHref(anchor.getAttribute('href') ?? '');
    if (!citation) {
      continue;
    }
    const link = anchor.ownerDocument.createElement('a');
    link.className = CITATION_CLASS;
    link.href = anchor.getAttribute('href') ?? '#';
    link.textContent = anchor.textContent;
    link.title = `Open ${anchor.textContent ?? 'the cited passage'} in Kaizen`;
    link.dataset.documentId = citation.documentId;
    link.dataset.version = String(citation.version);
    link.dataset.chunkId = citation.chunkId;
    link.addEventListener('click', event => {
      event.preventDefault();
      event.stopPropagation();
      open(citation, link.textContent ?? '');
    });
    anchor.replaceWith(link);
    count++;
  }
  return count;
}

// --- documents from Jupyter ---------------------------------------------------------------

export type AddOutcome = 'created' | 'new_version' | 'unchanged';

export interface IAddedDocument {
  path: string;
  outcome: AddOutcome;
  documentId: string;
  title: string;
  version: number;
}

const OUTCOMES: AddOutcome[] = ['created', 'new_version', 'unchanged'];

export function parseAdded(body: unknown): IAddedDocument | null {
  if (!isRecord(body) || typeof body.path !== 'string' || !isRecord(body.document)) {
    return null;
  }
  const outcome = OUTCOMES.find(o => o === body.outcome);
  const document = body.document;
  if (
    !outcome ||
    typeof document.id !== 'string' ||
    typeof document.title !== 'string' ||
    typeof document.version !== 'number'
  ) {
    return null;
  }
  return {
    path: body.path,
    outcome,
    documentId: document.id,
    title: document.title,
    version: document.version
  };
}

/** Add the Jupyter file at `path` (relative to the Jupyter root) to the member's documents. */
export function addJupyterDocument(api: KaizenApi, path: string): Promise<Result<IAddedDocument>> {
  return api.call('POST', 'jupyter-documents', { path }, `add ${path} to your documents`, parseAdded);
}

/** The notification after an add. */
export function addedMessage(added: IAddedDocument): string {
  switch (added.outcome) {
    case 'created':
      return `Added ${added.path} to your Kaizen documents.`;
    case 'new_version':
      return `Updated ${added.path} in your Kaizen documents (version ${added.version}).`;
    default:
      return `${added.path} is already in your Kaizen documents, unchanged (version ${added.version}).`;
  }
}

/** Add each path in turn; one sentence per file, success or failure. */
export async function addJupyterDocuments(
  api: KaizenApi,
  paths: string[]
): Promise<Array<{ path: string; ok: boolean; message: string }>> {
  const out: Array<{ path: string; ok: boolean; message: string }> = [];
  for (const path of paths) {
    const added = await addJupyterDocument(api, path);
    out.push(
      added.ok
        ? { path, ok: true, message: addedMessage(added.value) }
        : { path, ok: false, message: `Kaizen could not add ${path}: ${added.message}` }
    );
  }
  return out;
}

// --- what a citation opens --------------------------------------------------------------

export interface IPassage {
  chunkId: string;
  ordinal: number;
  locator: string;
  text: string;
}

export interface IDocumentPassages {
  documentId: string;
  version: number;
  currentVersion: number;
  title: string;
  sourcePath: string | null;
  passages: IPassage[];
}

export function parsePassages(body: unknown): IDocumentPassages | null {
  if (
    !isRecord(body) ||
    typeof body.document_id !== 'string' ||
    typeof body.version !== 'number' ||
    typeof body.current_version !== 'number' ||
    typeof body.title !== 'string' ||
    !Array.isArray(body.passages)
  ) {
    return null;
  }
  const passages: IPassage[] = [];
  for (const item of body.passages) {
    if (
      !isRecord(item) ||
      typeof item.chunk_id !== 'string' ||
      typeof item.ordinal !== 'number' ||
      typeof item.locator !== 'string' ||
      typeof item.text !== 'string'
    ) {
      return null;
    }
    passages.push({ chunkId: item.chunk_id, ordinal: item.ordinal, locator: item.locator, text: item.text });
  }
  return {
    documentId: body.document_id,
    version: body.version,
    currentVersion: body.current_version,
    title: body.title,
    sourcePath: typeof body.source_path === 'string' ? body.source_path : null,
    passages
  };
}

/** The sentence shown when a cited document cannot be opened. */
export const NO_LONGER_AVAILABLE =
  'This document is no longer available to you: it was deleted, or it is no longer shared with you.';

/** The cited version's passages, or a sentence: a 404 is "no longer available". */
export async function openCitation(
  api: KaizenApi,
  citation: ICitation
): Promise<Result<IDocumentPassages>> {
  const path =
    `documents/${encodeURIComponent(citation.documentId)}/versions/${citation.version}/passages`;
  const result = await api.call('GET', path, undefined, 'open the cited document', parsePassages);
  if (!result.ok && result.status === 404) {
    return { ok: false, message: NO_LONGER_AVAILABLE, status: 404 };
  }
  return result;
}

// --- the member's documents -------------------------------------------------------------

/** One entry of `GET kaizen/api/documents`. */
export interface IDocumentSummary {
  id: string;
  owner: string;
  title: string;
  version: number;
  filename: string;
  chunks: number;
  updatedAt: string;
  /** The owner's Jupyter path it was added from; null for an upload or another's. */
  sourcePath: string | null;
}

export function parseDocuments(body: unknown): IDocumentSummary[] | null {
  if (!Array.isArray(body)) {
    return null;
  }
  const out: IDocumentSummary[] = [];
  for (const item of body) {
    if (
      !isRecord(item) ||
      typeof item.id !== 'string' ||
      typeof item.owner !== 'string' ||
      typeof item.title !== 'string' ||
      typeof item.version !== 'number' ||
      typeof item.filename !== 'string' ||
      typeof item.chunks !== 'number'
    ) {
      return null;
    }
    out.push({
      id: item.id,
      owner: item.owner,
      title: item.title,
      version: item.version,
      filename: item.filename,
      chunks: item.chunks,
      updatedAt: typeof item.updated_at === 'string' ? item.updated_at : '',
      sourcePath: typeof item.source_path === 'string' ? item.source_path : null
    });
  }
  return out;
}

export function listDocuments(api: KaizenApi): Promise<Result<IDocumentSummary[]>> {
  return api.call('GET', 'documents', undefined, 'list your documents', parseDocuments);
}

/** Delete a document the member owns (every version, passage and share goes with it). */
export function removeDocument(api: KaizenApi, documentId: string): Promise<Result<true>> {
  return api.call(
    'DELETE',
    `documents/${encodeURIComponent(documentId)}`,
    undefined,
    'remove the document',
    () => true
  );
}

/** What the view says above the passages: the version, and whether a newer one exists. */
export function versionNote(passages: IDocumentPassages): string {
  return passages.version < passages.currentVersion
    ? `Version ${passages.version} (the cited one); the current version is ${passages.currentVersion}.`
    : `Version ${passages.version}.`;
}
