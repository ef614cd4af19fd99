import assert from 'node:assert/strict';
import { describe, it } from 'node:test';

import { KaizenApi, Result } from '../src/api';
import {
  addedMessage,
  addJupyterDocuments,
  citationOfHref,
  linkCitations,
  NO_LONGER_AVAILABLE,
  openCitation,
  listDocuments,
  parseAdded,
  parseDocuments,
  parsePassages,
  removeDocument,
  versionNote
} from '../src/documents';

const DOC = 'd0c5e1f2a3b4c5d6e7f8a9b0c1d2e3f4';
const CHUNK = '0123456789abcdef0123456789abcdef';
const CITATION = `[Travel policy, v2, lines 1-4](kaizen:document/${DOC}/v2#chunk=${CHUNK})`;

/** A fake API answering each path from `answers` (a Result), recording the calls. */
function fakeApi(answers: Record<string, (body: unknown) => Result<unknown>>) {
  const calls: Array<{ method: string; path: string; body: unknown }> = [];
  const api = {
    call: <T>(method: string, path: string, body: unknown, _action: string,
              parse: (b: unknown) => T | null): Promise<Result<T>> => {
      calls.push({ method, path, body });
      const answer = answers[path]?.(body) ?? { ok: false, message: 'no route', status: 404 };
      if (!answer.ok) {
        return Promise.resolve(answer);
      }
      const value = parse(answer.value);
      return Promise.resolve(
        value === null ? { ok: false, message: 'unreadable', status: 200 } : { ok: true, value }
      );
    }
  } as unknown as KaizenApi;
  return { api, calls };
}

describe('citations as links', () => {
  it('rewrites a document citation target into a fragment the sanitizer keeps', () => {
    const text = `Economy is required ${CITATION}.`;
    assert.equal(
      linkCitations(text),
      `Economy is required [Travel policy, v2, lines 1-4](#kaizen-citation/${DOC}/2/${CHUNK}).`
    );
    assert.deepEqual(citationOfHref(`#kaizen-citation/${DOC}/2/${CHUNK}`), {
      documentId: DOC,
      version: 2,
      chunkId: CHUNK
    });
  });

  it('leaves other links, removed citations and malformed targets alone', () => {
    for (const text of [
      '[site](https://example.org)',
      'Doubled [Lynx, v1] [unverified citation removed].',
      `[x](kaizen:document/${DOC}/v0#chunk=${CHUNK})`,
      `[x](kaizen:document/../v1#chunk=${CHUNK})`,
      `[x](kaizen:document/${DOC}/v1#chunk=a"onclick=1)`,
      '[x](kaizen:conversation/c1#position=3)'
    ]) {
      assert.equal(linkCitations(text), text);
    }
    assert.equal(citationOfHref('#kaizen-citation/../1/x'), null);
    assert.equal(citationOfHref('#somewhere'), null);
    assert.equal(citationOfHref(`https://x/#kaizen-citation/${DOC}/2/${CHUNK}`), null);
  });
});

describe('adding Jupyter files to the documents', () => {
  const added = (path: string, outcome: string, version: number) => ({
    ok: true as const,
    value: { path, outcome, document: { id: `id-${path}`, title: path, version } }
  });

  it('sends only the path, once per selected file, and says what happened to each', async () => {
    const outcomes: Record<string, Result<unknown>> = {
      'a.md': added('a.md', 'created', 1),
      'b.ipynb': added('b.ipynb', 'new_version', 3),
      'c.txt': added('c.txt', 'unchanged', 1),
      'd.exe': { ok: false, message: 'This kind of file cannot be added as a document.', status: 422 }
    };
    const { api, calls } = fakeApi({
      'jupyter-documents': body => outcomes[(body as { path: string }).path]
    });
    const results = await addJupyterDocuments(api, ['a.md', 'b.ipynb', 'c.txt', 'd.exe']);
    assert.deepEqual(calls.map(c => [c.method, c.path, c.body]), [
      ['POST', 'jupyter-documents', { path: 'a.md' }],
      ['POST', 'jupyter-documents', { path: 'b.ipynb' }],
      ['POST', 'jupyter-documents', { path: 'c.txt' }],
      ['POST', 'jupyter-documents', { path: 'd.exe' }]
    ]);
    assert.deepEqual(results.map(r => r.ok), [true, true, true, false]);
    assert.equal(results[0].message, 'Added a.md to your Kaizen documents.');
    assert.match(results[1].message, /Updated b\.ipynb .*version 3/);
    assert.match(results[2].message, /already .* unchanged/);
    assert.equal(
      results[3].message,
      'Kaizen could not add d.exe: This kind of file cannot be added as a document.'
    );
  });

  it('refuses an answer that is not the documented shape', () => {
    assert.equal(parseAdded({ path: 'a.md', outcome: 'replaced', document: { id: 'x', title: 't', version: 1 } }), null);
    assert.equal(parseAdded({ path: 'a.md', outcome: 'created' }), null);
    const ok = parseAdded({ path: 'a.md', outcome: 'created', document: { id: 'x', title: 't', version: 1 } });
    assert.ok(ok);
    assert.equal(addedMessage(ok), 'Added a.md to your Kaizen documents.');
  });
});

describe('opening a citation', () => {
  const passages = {
    document_id: DOC,
    version: 2,
    current_version: 3,
    title: 'Travel policy',
    source_path: 'notes/policy.md',
    passages: [
      { chunk_id: 'other', ordinal: 0, locator: 'lines 1-2', text: '# Travel policy' },
      { chunk_id: CHUNK, ordinal: 1, locator: 'lines 3-4', text: 'Economy class is required.' }
    ]
  };

  it("reads the cited version's passages", async () => {
    const { api, calls } = fakeApi({
      [`documents/${DOC}/versions/2/passages`]: () => ({ ok: true, value: passages })
    });
    const opened = await openCitation(api, { documentId: DOC, version: 2, chunkId: CHUNK });
    assert.equal(calls[0].method, 'GET');
    assert.ok(opened.ok);
    assert.equal(opened.value.sourcePath, 'notes/policy.md');
    assert.deepEqual(opened.value.passages.map(p => p.chunkId), ['other', CHUNK]);
    assert.equal(versionNote(opened.value), 'Version 2 (the cited one); the current version is 3.');
  });

  it('says a deleted or unshared document is no longer available', async () => {
    const { api } = fakeApi({
      [`documents/${DOC}/versions/2/passages`]: () => ({
        ok: false,
        message: 'The document does not exist or is not available to you.',
        status: 404
      })
    });
    const opened = await openCitation(api, { documentId: DOC, version: 2, chunkId: CHUNK });
    assert.deepEqual(opened, { ok: false, message: NO_LONGER_AVAILABLE, status: 404 });
  });

  it('refuses malformed passages', () => {
    assert.equal(parsePassages({ ...passages, passages: [{ chunk_id: 1 }] }), null);
    assert.equal(parsePassages({ ...passages, version: '2' }), null);
    assert.equal(parsePassages({ ...passages, source_path: null })?.sourcePath, null);
  });
});

describe('the documents list', () => {
  const entry = {
    id: DOC, owner: 'alice', title: 'Travel policy', version: 2, filename: 'policy.md',
    media_type: 'text/markdown', size: 40, sha256: 'x', chunks: 3,
    created_at: '2026-12-04T00:00:00Z', updated_at: '2026-12-04T00:00:00Z',
    source_path: 'notes/policy.md'
  };

  it('lists documents with where they came from, and removes by id', async () => {
    const { api, calls } = fakeApi({
      documents: () => ({ ok: true, value: [entry, { ...entry, id: 'd2', owner: 'bob', source_path: null }] }),
      [`documents/${DOC}`]: () => ({ ok: true, value: null })
    });
    const listed = await listDocuments(api);
    assert.ok(listed.ok);
    assert.deepEqual(listed.value.map(d => [d.id, d.owner, d.sourcePath]), [
      [DOC, 'alice', 'notes/policy.md'],
      ['d2', 'bob', null]
    ]);
    const removed = await removeDocument(api, DOC);
    assert.deepEqual(removed, { ok: true, value: true });
    assert.deepEqual(calls.map(c => [c.method, c.path]), [['GET', 'documents'], ['DELETE', `documents/${DOC}`]]);
  });

  it('refuses a listing that is not the documented shape', () => {
    assert.equal(parseDocuments({ documents: [] }), null);
    assert.equal(parseDocuments([{ ...entry, version: '2' }]), null);
  });
});
