/**
 * run_code generation placeholders in the Artifacts pane. Each declared target shows a
 * non-downloadable placeholder from `tool.requested`; the same call's `tool.settled` morphs
 * it into the durable file or removes it; a run that ends with the call unsettled removes it;
 * and a frame lost on the socket is settled from the durable journal on reconnect.
 */
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';

import { Result } from '../src/api';
import { IArtifact } from '../src/artifacts';
import {
  ArtifactsModel,
  GenerationEntry,
  generationEntries,
  visibleGeneration
} from '../src/artifactsModel';
import { applyFrames, IConversationState, initialState } from '../src/journal';
import { IJournalEvent } from '../src/protocol';
import { CONV, ev } from './helpers';

const TARGETS = [{ target: 'summary.csv' }, { target: 'charts/plot.png' }];
const SUMMARY = {
  target: 'summary.csv',
  artifact_id: 'art-summary',
  version: 3,
  filename: 'summary.csv',
  media_type: 'text/csv'
};

/** A run that opens one run_code call declaring two targets (seq 1..4). */
function opened(run = 'r1', call = 'call-1', start = 1): IJournalEvent[] {
  return [
    ev(start, 'input.accepted', { input_id: `i-${run}`, position: start, text: 'make files' }, run),
    ev(start + 1, 'run.admitted', { model: 'fake-model' }, run),
    ev(start + 2, 'model.step.started', { step: 1, attempt: 1 }, run),
    ev(
      start + 3,
      'tool.requested',
      {
        step: 1,
        call_id: call,
        name: 'run_code',
        arguments: { code: '...', artifact_targets: ['summary.csv', './charts/plot.png'] },
        placeholders: TARGETS
      },
      run
    )
  ];
}

function settled(seq: number, files: unknown[], outcome = 'ok', run = 'r1', call = 'call-1'): IJournalEvent {
  return ev(
    seq,
    'tool.settled',
    { step: 1, call_id: call, name: 'run_code', outcome, capability: 'write', content: '{}', files },
    run
  );
}

function ended(seq: number, status = 'completed', run = 'r1'): IJournalEvent {
  return ev(seq, 'run.terminal', { status, reason: status === 'completed' ? 'answered' : 'interrupted' }, run);
}

function fold(events: readonly IJournalEvent[]): IConversationState {
  return applyFrames(initialState(CONV), events);
}

/** The entries without their keys, for readable comparisons. */
function shape(entries: readonly GenerationEntry[]): Array<Record<string, unknown>> {
  return entries.map(({ key: _key, runId: _run, callId: _call, ...rest }) => rest);
}

describe('R-236: generation placeholders from the journal', () => {
  it('R-236: shows one non-downloadable placeholder per declared target once the call is requested', () => {
    const entries = generationEntries(fold(opened()));
    assert.deepEqual(shape(entries), [
      { state: 'generating', target: 'summary.csv' },
      { state: 'generating', target: 'charts/plot.png' }
    ]);
    // Keyed by the run-bound reference: run, call and target.
    assert.deepEqual(
      entries.map(e => e.key),
      ['r1/call-1/summary.csv', 'r1/call-1/charts/plot.png']
    );
    assert.ok(entries.every(e => !('artifactId' in e)), 'a placeholder names no file to download');
  });

  it('R-236: morphs a produced target into its durable file and removes the one not produced', () => {
    const entries = generationEntries(fold([...opened(), settled(5, [SUMMARY])]));
    assert.deepEqual(shape(entries), [
      {
        state: 'ready',
        target: 'summary.csv',
        artifactId: 'art-summary',
        version: 3,
        filename: 'summary.csv',
        mediaType: 'text/csv'
      }
    ]);
  });

  it('R-236: removes every placeholder of a call that settles without its file', () => {
    // A program that raised before writing anything: a failed completion with no files.
    assert.deepEqual(generationEntries(fold([...opened(), settled(5, [], 'error')])), []);
    // A recovered call, closed by recovery as an error without a files field.
    const rebuilt = ev(5, 'tool.settled', {
      step: 1,
      call_id: 'call-1',
      name: 'run_code',
      outcome: 'error',
      reason: 'interrupted',
      rebuilt: true
    });
    assert.deepEqual(generationEntries(fold([...opened(), rebuilt])), []);
  });

  it('R-236: removes the placeholders when the run ends and the call never settled', () => {
    assert.equal(generationEntries(fold(opened())).length, 2);
    assert.deepEqual(generationEntries(fold([...opened(), ended(5, 'failed')])), []);
  });

  it('R-236: a frame lost on the socket is settled from the journal on reconnect, to the same state', () => {
    const journal = [...opened(), settled(5, [SUMMARY]), ev(6, 'answer.committed', { step: 2, text: 'done' }), ended(7)];
    // Live: the socket delivered the request, then dropped before the settling frame.
    let live = applyFrames(initialState(CONV), journal.slice(0, 4), { announce: true });
    assert.equal(generationEntries(live)[0].state, 'generating');
    // Reconnect: the page after lastSeq (with an overlapping duplicate) settles it.
    const page = journal.filter(e => e.seq > live.lastSeq - 1);
    live = applyFrames(live, page);
    const rebuilt = fold(journal);
    assert.deepEqual(generationEntries(live), generationEntries(rebuilt));
    assert.deepEqual(
      shape(generationEntries(live)).map(e => [e.state, e.target]),
      [['ready', 'summary.csv']]
    );

    // The settling frame itself never reached the journal (a crash): the run's end does.
    const lostSettle = [...opened(), ended(5, 'failed')];
    let dropped = applyFrames(initialState(CONV), lostSettle.slice(0, 4));
    dropped = applyFrames(dropped, lostSettle.filter(e => e.seq > dropped.lastSeq));
    assert.deepEqual(generationEntries(dropped), []);
    assert.deepEqual(generationEntries(dropped), generationEntries(fold(lostSettle)));
  });

  it('R-236: keeps each call to its own placeholders across calls and runs', () => {
    const events = [
      ...opened('r1', 'call-1', 1),
      settled(5, [SUMMARY], 'ok', 'r1', 'call-1'),
      ended(6, 'completed', 'r1'),
      ...opened('r2', 'call-9', 7)
    ];
    const entries = generationEntries(fold(events));
    assert.deepEqual(
      entries.map(e => [e.key, e.state]),
      [
        ['r1/call-1/summary.csv', 'ready'],
        ['r2/call-9/summary.csv', 'generating'],
        ['r2/call-9/charts/plot.png', 'generating']
      ]
    );
    // Another call's settlement does not touch them.
    const other = settled(11, [{ ...SUMMARY, artifact_id: 'x' }], 'ok', 'r2', 'call-other');
    assert.deepEqual(
      generationEntries(fold([...events, other])).map(e => e.state),
      ['ready', 'generating', 'generating']
    );
  });

  it('R-236: reads only the backend placeholders and whole stored files, never the arguments', () => {
    // Declared in the arguments but not published as placeholders (invalid call): nothing.
    const invalid = [
      ...opened().slice(0, 3),
      ev(4, 'tool.requested', {
        step: 1,
        call_id: 'call-1',
        name: 'run_code',
        arguments: { code: '...', artifact_targets: ['../escape.txt'] }
      })
    ];
    assert.deepEqual(generationEntries(fold(invalid)), []);
    // Malformed files entries are ignored: the placeholder is simply not produced.
    const malformed = settled(5, [
      { target: 'summary.csv', artifact_id: 'a', version: 0 },
      { target: 'summary.csv', version: 1 },
      'summary.csv',
      { ...SUMMARY, target: 'charts/plot.png', filename: undefined, media_type: 7 }
    ]);
    assert.deepEqual(shape(generationEntries(fold([...opened(), malformed]))), [
      {
        state: 'ready',
        target: 'charts/plot.png',
        artifactId: 'art-summary',
        version: 3,
        filename: 'charts/plot.png',
        mediaType: ''
      }
    ]);
  });

  it('R-236: a generated file gives way to the listing once the listing has that version', () => {
    const entries = generationEntries(
      fold([...opened('r1', 'call-1', 1), settled(5, [SUMMARY]), ...opened('r2', 'call-2', 6)])
    );
    const listing = (latestVersion: number): IArtifact[] => [
      {
        id: 'art-summary',
        owner: 'alice',
        version: latestVersion,
        latestVersion,
        kind: 'file',
        language: null,
        title: 'summary.csv',
        mime: 'text/csv',
        digest: 'd'.repeat(64),
        size: 22,
        author: 'alice',
        conversationId: CONV,
        roomId: null,
        governed: false,
        createdAt: '2026-01-01T00:00:00+00:00'
      }
    ];
    const states = (listed: IArtifact[]) => visibleGeneration(entries, listed).map(e => e.state);
    assert.deepEqual(states([]), ['ready', 'generating', 'generating']);
    assert.deepEqual(states(listing(2)), ['ready', 'generating', 'generating']); // not caught up
    assert.deepEqual(states(listing(3)), ['generating', 'generating']);
  });

  it('R-236: downloads a generated file as that exact version through the download route', async () => {
    const calls: string[] = [];
    const api = {
      artifacts: (): Promise<Result<IArtifact[]>> => Promise.resolve({ ok: true, value: [] }),
      artifact: () => Promise.resolve({ ok: false as const, message: 'No such artifact.', status: 404 }),
      downloadArtifact: (
        id: string,
        version: number | null,
        conversationId: string
      ): Promise<Result<{ blob: Blob; filename: string }>> => {
        calls.push(`download ${id} ${version} ${conversationId}`);
        return Promise.resolve({ ok: true, value: { blob: new Blob(['x']), filename: 'summary.csv' } });
      }
    };
    const model = new ArtifactsModel(api, CONV);
    const saved: string[] = [];
    await model.downloadVersion('art-summary', 3, (_blob, name) => saved.push(name));
    assert.deepEqual(calls, [`download art-summary 3 ${CONV}`]);
    assert.deepEqual(saved, ['summary.csv']);
    assert.equal(model.getSnapshot().downloading, false);
  });
});
