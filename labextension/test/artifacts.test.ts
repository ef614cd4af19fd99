import assert from 'node:assert/strict';
import { describe, it } from 'node:test';

import { artifactPath, Result } from '../src/api';
import {
  attachmentName,
  FRAME_POLICY,
  frameDocument,
  IArtifact,
  IArtifactView,
  isGovernedArtifact,
  kindLabel,
  MAX_TABLE_ROWS,
  nativeTable,
  parseArtifact,
  parseArtifacts,
  parseArtifactView,
  previewMode,
  readGovernedEnvelope
} from '../src/artifacts';
import { ArtifactsModel } from '../src/artifactsModel';
import { applyFrames, initialState } from '../src/journal';
import { CONV, ev } from './helpers';

const WIRE = {
  id: 'a1',
  owner: 'alice',
  version: 2,
  latest_version: 2,
  kind: 'html',
  language: null,
  title: 'Page',
  mime: 'text/html',
  digest: 'd'.repeat(64),
  size: 120,
  author: 'alice',
  conversation_id: CONV,
  room_id: null,
  governed: false,
  derived_from: null,
  created_at: '2026-01-01T00:00:00+00:00'
};

function artifact(over: Partial<IArtifactView> = {}): IArtifactView {
  return { ...(parseArtifactView({ ...WIRE, content: '<p>hi</p>', versions: [1, 2] }) as IArtifactView), ...over };
}

const ENVELOPE = {
  version: 2,
  renderer: 'table',
  title: 'Jobs',
  text_fallback: '<b>2 rows</b>',
  markings: { overall: 'UNCLASSIFIED', portions: { col_b: 'CUI' } },
  provenance: { job: 'j-1' },
  result: { columns: ['a', 'b'], rows: [[1, '<script>x</script>'], [2, { n: 1 }]] }
};

describe('reading the artifact routes', () => {
  it('reads a listing and a version defensively', () => {
    const [first] = parseArtifacts([WIRE, { id: 'no-version' }, null]) ?? [];
    assert.equal(first.id, 'a1');
    assert.equal(first.latestVersion, 2);
    assert.equal(first.conversationId, CONV);
    assert.equal(parseArtifacts({ artifacts: [] }), null);
    assert.equal(parseArtifact({ ...WIRE, version: 0 }), null);
    const view = parseArtifactView({ ...WIRE, content: 'x', versions: [1, 'two', 2] });
    assert.deepEqual(view?.versions, [1, 2]);
    assert.equal(view?.content, 'x');
    // A file: no content in the answer, the version list still there.
    const file = parseArtifactView({ ...WIRE, kind: 'file', mime: 'image/png', versions: [] });
    assert.equal(file?.content, null);
    assert.deepEqual(file?.versions, [2]);
  });

  it('builds the routes with the room and an encoded id', () => {
    assert.equal(artifactPath('a/1', null, '', 'c 1'), 'artifacts/a%2F1?conversation_id=c%201');
    assert.equal(
      artifactPath('a1', 3, '/download', 'c1'),
      'artifacts/a1/versions/3/download?conversation_id=c1'
    );
    assert.equal(attachmentName('attachment; filename="Page.html"', 'artifact'), 'Page.html');
    assert.equal(attachmentName('attachment; filename="../x/y.md"', 'a'), '.._x_y.md');
    assert.equal(attachmentName(null, 'artifact'), 'artifact');
  });
});

describe('how an artifact may be previewed', () => {
  it('previews ordinary kinds by kind', () => {
    const base = { governed: false, language: null, mime: '' };
    assert.equal(previewMode({ ...base, kind: 'html' }), 'frame');
    assert.equal(previewMode({ ...base, kind: 'svg' }), 'frame');
    assert.equal(previewMode({ ...base, kind: 'markdown' }), 'markdown');
    assert.equal(previewMode({ ...base, kind: 'react' }), 'canvas-source');
    assert.equal(previewMode({ ...base, kind: 'mermaid' }), 'canvas-source');
    assert.equal(previewMode({ ...base, kind: 'code', language: 'python' }), 'text');
    assert.equal(previewMode({ ...base, kind: 'json' }), 'text');
    assert.equal(previewMode({ ...base, kind: 'file', mime: 'image/png' }), 'download');
    assert.equal(previewMode({ ...base, kind: 'something-new' }), 'download');
  });

  it('never sends a governed artifact to the frame, whatever its kind claims', () => {
    for (const kind of ['html', 'svg', 'markdown', 'react', 'code', 'json', 'file']) {
      assert.equal(previewMode({ kind, governed: true, language: null, mime: '' }), 'governed', kind);
      assert.equal(
        previewMode({ kind, governed: false, language: null, mime: 'application/vnd.kaizen.renderable+json' }),
        'governed',
        kind
      );
    }
    // The reserved pair takes the governed path even when the server did not flag it.
    const pair = { kind: 'code', language: 'renderable-artifact', governed: false, mime: 'text/plain' };
    assert.equal(isGovernedArtifact(pair), true);
    assert.equal(previewMode(pair), 'governed');
    assert.equal(kindLabel(pair), 'governed result');
    assert.equal(isGovernedArtifact({ kind: 'code', language: 'python', governed: false, mime: '' }), false);
  });

  it('frames a document behind a no-network policy', () => {
    const doc = frameDocument('<img src="https://tracker.example/p.png">');
    assert.ok(doc.startsWith('<meta http-equiv="Content-Security-Policy"'));
    assert.ok(doc.includes(FRAME_POLICY));
    assert.match(FRAME_POLICY, /default-src 'none'/);
    assert.doesNotMatch(FRAME_POLICY, /script-src/);
    assert.ok(doc.endsWith('<img src="https://tracker.example/p.png">'));
  });
});

describe('governed envelopes', () => {
  it('reads markings as a map and the reviewed table as text cells', () => {
    const view = readGovernedEnvelope(JSON.stringify(ENVELOPE));
    assert.ok(view);
    assert.deepEqual(view.markings, [
      ['overall', 'UNCLASSIFIED'],
      ['portions', '{"col_b":"CUI"}']
    ]);
    assert.deepEqual(view.provenance, [['job', 'j-1']]);
    assert.deepEqual(view.table, {
      columns: ['a', 'b'],
      rows: [
        ['1', '<script>x</script>'],
        ['2', '{"n":1}']
      ],
      omitted: 0
    });
    assert.equal(view.resultRef, null);
  });

  it('shows the text fallback for an unknown renderer or an unreadable result', () => {
    const unknown = readGovernedEnvelope(JSON.stringify({ ...ENVELOPE, renderer: 'iframe_html' }));
    assert.equal(unknown?.table, null);
    assert.equal(unknown?.textFallback, '<b>2 rows</b>');
    const odd = readGovernedEnvelope(JSON.stringify({ ...ENVELOPE, result: 'just text' }));
    assert.equal(odd?.table, null);
    assert.equal(readGovernedEnvelope('not json'), null);
    assert.equal(readGovernedEnvelope(null), null);
  });

  it('labels a result_ref and never turns it into a table', () => {
    const { result: _dropped, ...rest } = ENVELOPE;
    const view = readGovernedEnvelope(
      JSON.stringify({ ...rest, result_ref: { id: 'jobs:j-1:result', sha256: 'ab'.repeat(32) } })
    );
    assert.deepEqual(view?.resultRef, { id: 'jobs:j-1:result', sha256: 'ab'.repeat(32) });
    assert.equal(view?.table, null);
    assert.equal(view?.textFallback, '<b>2 rows</b>');
  });

  it('reads record lists as tables and bounds the rows', () => {
    const records = Array.from({ length: MAX_TABLE_ROWS + 5 }, (_, i) => ({ n: i, extra: i % 2 ? 'x' : undefined }));
    const table = nativeTable(records);
    assert.deepEqual(table?.columns, ['n', 'extra']);
    assert.equal(table?.rows.length, MAX_TABLE_ROWS);
    assert.equal(table?.omitted, 5);
    assert.equal(nativeTable({ columns: ['a'], rows: ['not a row'] }), null);
    assert.equal(nativeTable([]), null);
  });
});

describe('the journal signals artifact writes', () => {
  it('moves artifactSeq on artifact.version and on an artifact tool settling', () => {
    let state = initialState(CONV);
    assert.equal(state.artifactSeq, 0);
    state = applyFrames(state, [
      ev(1, 'input.accepted', { input_id: 'i', position: 1, text: 'x', kind: 'message' }),
      ev(2, 'run.admitted', {}),
      ev(3, 'tool.requested', { step: 1, call_id: 'c-read', name: 'list_available_agents' }),
      ev(4, 'tool.settled', { step: 1, call_id: 'c-read', name: 'list_available_agents', outcome: 'ok' })
    ]);
    assert.equal(state.artifactSeq, 0, 'a read-only tool does not refresh the pane');
    state = applyFrames(state, [
      ev(5, 'tool.requested', { step: 1, call_id: 'c-make', name: 'create_artifact' }),
      ev(6, 'artifact.version', { artifact_id: 'a1', version: 1, kind: 'html' })
    ]);
    assert.equal(state.artifactSeq, 6);
    // A settled event without a name: the requested call's name counts.
    state = applyFrames(state, [ev(7, 'tool.settled', { step: 1, call_id: 'c-make', outcome: 'ok' })]);
    assert.equal(state.artifactSeq, 7);
    state = applyFrames(state, [ev(8, 'tool.settled', { step: 1, call_id: 'c-run', name: 'run_code', outcome: 'ok' })]);
    assert.equal(state.artifactSeq, 8);
    // A replayed event changes nothing.
    assert.equal(applyFrames(state, [ev(6, 'artifact.version', {})]), state);
  });
});

/** A fake API for the pane: answers queued per route, calls recorded. */
function fakeApi() {
  const calls: string[] = [];
  const lists: Result<IArtifact[]>[] = [];
  const views: Record<string, Result<IArtifactView>> = {};
  let release: (() => void) | null = null;
  let hold = false;
  const api = {
    artifacts: async (conversationId: string): Promise<Result<IArtifact[]>> => {
      calls.push(`list ${conversationId}`);
      if (hold) {
        await new Promise<void>(resolve => (release = resolve));
      }
      return lists.shift() ?? { ok: true, value: [] };
    },
    artifact: (id: string, version: number | null, conversationId: string): Promise<Result<IArtifactView>> => {
      calls.push(`get ${id} ${version ?? 'latest'} ${conversationId}`);
      return Promise.resolve(
        views[`${id}@${version ?? 'latest'}`] ?? { ok: false, message: 'No such artifact.', status: 404 }
      );
    },
    downloadArtifact: (
      id: string,
      version: number | null
    ): Promise<Result<{ blob: Blob; filename: string }>> => {
      calls.push(`download ${id} ${version}`);
      return Promise.resolve(
        id === 'gone'
          ? { ok: false, message: 'No such artifact.', status: 404 }
          : { ok: true, value: { blob: new Blob(['bytes']), filename: 'Page.html' } }
      );
    }
  };
  return {
    api,
    calls,
    lists,
    views,
    hold: (on: boolean) => (hold = on),
    release: () => release?.()
  };
}

const listed = (version: number): IArtifact => ({ ...artifact(), version, latestVersion: version });

describe('the artifacts pane state', () => {
  it('lists, selects, follows the latest version and keeps a picked one', async () => {
    const fake = fakeApi();
    const model = new ArtifactsModel(fake.api, CONV);
    assert.equal(model.getSnapshot().list.phase, 'loading');
    fake.lists.push({ ok: true, value: [listed(1)] });
    await model.refresh();
    assert.equal(model.getSnapshot().list.phase, 'ready');

    fake.views['a1@latest'] = { ok: true, value: artifact({ version: 1, versions: [1] }) };
    await model.select('a1');
    const shown = model.getSnapshot().view;
    assert.equal(shown?.phase === 'ready' && shown.value.version, 1);

    // A new version appears: the pane follows the latest.
    fake.lists.push({ ok: true, value: [listed(2)] });
    fake.views['a1@latest'] = { ok: true, value: artifact({ version: 2, versions: [1, 2] }) };
    await model.refresh();
    const followed = model.getSnapshot().view;
    assert.equal(followed?.phase === 'ready' && followed.value.version, 2);

    // Picking version 1 pins it: a refresh does not move it.
    fake.views['a1@1'] = { ok: true, value: artifact({ version: 1, versions: [1, 2] }) };
    await model.pickVersion(1);
    fake.lists.push({ ok: true, value: [listed(3)] });
    await model.refresh();
    const pinned = model.getSnapshot().view;
    assert.equal(pinned?.phase === 'ready' && pinned.value.version, 1);
    assert.deepEqual(fake.calls, [
      `list ${CONV}`,
      `get a1 latest ${CONV}`,
      `list ${CONV}`,
      `get a1 latest ${CONV}`,
      `get a1 1 ${CONV}`,
      `list ${CONV}`
    ]);
  });

  it('drops a selection that is no longer listed and shows a failed open member-safely', async () => {
    const fake = fakeApi();
    const model = new ArtifactsModel(fake.api, CONV);
    fake.lists.push({ ok: true, value: [listed(1)] });
    await model.refresh();
    await model.select('a1'); // no view queued: the server says 404
    const failed = model.getSnapshot().view;
    assert.deepEqual(failed, { phase: 'error', message: 'No such artifact.' });
    fake.lists.push({ ok: true, value: [] });
    await model.refresh();
    assert.equal(model.getSnapshot().selectedId, null);
    assert.equal(model.getSnapshot().view, null);
  });

  it('keeps a shown listing when a refresh fails, and reports a first failure', async () => {
    const fake = fakeApi();
    const model = new ArtifactsModel(fake.api, CONV);
    fake.lists.push({ ok: false, message: 'Kaizen could not reach the Jupyter server.', status: 0 });
    await model.refresh();
    assert.deepEqual(model.getSnapshot().list, {
      phase: 'error',
      message: 'Kaizen could not reach the Jupyter server.'
    });
    fake.lists.push({ ok: true, value: [listed(1)] });
    await model.refresh();
    fake.lists.push({ ok: false, message: 'Try again later.', status: 500 });
    await model.refresh();
    const list = model.getSnapshot().list;
    assert.equal(list.phase === 'ready' && list.value.length, 1);
  });

  it('coalesces a burst of refreshes into one more request', async () => {
    const fake = fakeApi();
    const model = new ArtifactsModel(fake.api, CONV);
    fake.hold(true);
    const first = model.refresh();
    const burst = [model.refresh(), model.refresh(), model.refresh()];
    fake.hold(false);
    fake.release();
    await Promise.all([first, ...burst]);
    assert.equal(fake.calls.filter(c => c.startsWith('list')).length, 2);
  });

  it('downloads the shown version, and says so member-safely when it fails', async () => {
    const fake = fakeApi();
    const model = new ArtifactsModel(fake.api, CONV);
    fake.views['a1@latest'] = { ok: true, value: artifact({ version: 2 }) };
    await model.select('a1');
    const saved: string[] = [];
    await model.download((_blob, name) => saved.push(name));
    assert.deepEqual(saved, ['Page.html']);
    assert.ok(fake.calls.includes('download a1 2'));
    assert.equal(model.getSnapshot().message, null);

    await model.select('gone');
    await model.download(() => saved.push('never'));
    assert.equal(model.getSnapshot().message, 'No such artifact.');
    assert.deepEqual(saved, ['Page.html']);
    model.dismiss();
    assert.equal(model.getSnapshot().message, null);
  });
});
