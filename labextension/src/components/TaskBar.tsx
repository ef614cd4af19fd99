/**
 * This conversation's durable tasks (docs/tasks.md), folded under a "Tasks" summary: each
 * with Run now, Safe test, Pause/Resume and Delete, and a small form for a new one. A safe
 * test performs nothing outside the sandbox; the run shows up in the transcript like any.
 */
import React, { useState, useSyncExternalStore } from 'react';

import { Cadence, cadenceLabel, TasksModel } from '../tasks';

export function TaskBar({ model }: { model: TasksModel }): JSX.Element {
  const { tasks, lastRun, message } = useSyncExternalStore(model.subscribe, model.getSnapshot);
  const [name, setName] = useState('');
  const [prompt, setPrompt] = useState('');
  const [cadence, setCadence] = useState<Cadence>('manual');
  const [busy, setBusy] = useState(false);

  const submit = async (event: React.FormEvent): Promise<void> => {
    event.preventDefault();
    if (!prompt.trim() || busy) {
      return;
    }
    setBusy(true);
    const created = await model.create(name, prompt, cadence);
    setBusy(false);
    if (created) {
      setName('');
      setPrompt('');
      setCadence('manual');
    }
  };

  return (
    <details className="jp-Kaizen-tasks" aria-label="Tasks of this conversation">
      <summary>
        Tasks{tasks.length > 0 ? ` (${tasks.length})` : ''}
      </summary>
      <ul className="jp-Kaizen-taskList">
        {tasks.map(task => {
          const last = lastRun[task.id];
          return (
            <li key={task.id} className="jp-Kaizen-task" data-task-id={task.id}>
              <span className="jp-Kaizen-taskName" title={task.prompt}>
                {task.name}
              </span>
              <span className="jp-Kaizen-muted">
                {cadenceLabel(task)}
                {task.nextDueAt && task.status === 'active'
                  ? ` · next ${new Date(task.nextDueAt).toLocaleString()}`
                  : ''}
              </span>
              {last && (
                <span className="jp-Kaizen-muted" data-run-id={last.runId ?? ''}>
                  {last.error ?? (last.kind === 'safe_test' ? 'test queued' : 'run queued')}
                </span>
              )}
              <span className="jp-Kaizen-taskActions">
              <button type="button" onClick={() => void model.run(task.id, 'run')}>
                Run now
              </button>
              <button
                type="button"
                title="Runs the task without any action that changes things outside the sandbox"
                onClick={() => void model.run(task.id, 'test')}
              >
                Safe test
              </button>
              <button
                type="button"
                onClick={() => void model.setPaused(task, task.status === 'active')}
              >
                {task.status === 'active' ? 'Pause' : 'Resume'}
              </button>
              <button
                type="button"
                className="jp-Kaizen-iconButton"
                aria-label={`Delete the task ${task.name}`}
                title="Delete the task"
                onClick={() => void model.remove(task.id)}
              >
                ×
              </button>
              </span>
            </li>
          );
        })}
      </ul>
      <form className="jp-Kaizen-taskForm" onSubmit={event => void submit(event)}>
        <input
          aria-label="Task name"
          placeholder="Name (optional)"
          value={name}
          maxLength={200}
          onChange={event => setName(event.target.value)}
        />
        <textarea
          aria-label="Task prompt"
          placeholder="What should the task ask? e.g. Re-run the sales analysis and tell me if the numbers moved."
          value={prompt}
          rows={2}
          onChange={event => setPrompt(event.target.value)}
        />
        <select
          aria-label="How often"
          value={cadence}
          onChange={event => setCadence(event.target.value as Cadence)}
        >
          <option value="manual">By hand</option>
          <option value="hourly">Hourly</option>
          <option value="daily">Daily</option>
          <option value="weekly">Weekly</option>
        </select>
        <button type="submit" disabled={busy || !prompt.trim()}>
          Add task
        </button>
      </form>
      {message && (
        <p className="jp-Kaizen-error" role="alert">
          {message}
          <button type="button" className="jp-Kaizen-iconButton" aria-label="Dismiss"
                  onClick={() => model.dismiss()}>
            ×
          </button>
        </p>
      )}
    </details>
  );
}
