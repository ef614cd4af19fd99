/**
 * Durable tasks of one conversation (docs/tasks.md): the member's saved prompts aimed at this
 * room, run by hand, as a safe test, or on a cadence. Only the member's own tasks exist for
 * them; the server re-checks everything (posture, authority) on every run.
 */
import { KaizenApi, Result } from './api';
import { Observable } from './model';
import { isRecord } from './protocol';

export type Cadence = 'manual' | 'hourly' | 'daily' | 'weekly';

/** Seconds between due times for each cadence the panel offers (the API takes any >= 60). */
export const CADENCE_SECONDS: Record<Exclude<Cadence, 'manual'>, number> = {
  hourly: 3600,
  daily: 86400,
  weekly: 604800
};

export interface ITaskRun {
  kind: string;
  runId: string | null;
  status: string | null;
  error: string | null;
}

export interface ITask {
  id: string;
  conversationId: string;
  name: string;
  prompt: string;
  intervalSeconds: number | null;
  nextDueAt: string | null;
  status: 'active' | 'paused';
  version: number;
  missedFirings: number;
}

export function parseTask(body: unknown): ITask | null {
  if (!isRecord(body) || typeof body.id !== 'string' || typeof body.name !== 'string') {
    return null;
  }
  return {
    id: body.id,
    conversationId: String(body.conversation_id ?? ''),
    name: body.name,
    prompt: String(body.prompt ?? ''),
    intervalSeconds: typeof body.interval_seconds === 'number' ? body.interval_seconds : null,
    nextDueAt: typeof body.next_due_at === 'string' ? body.next_due_at : null,
    status: body.status === 'paused' ? 'paused' : 'active',
    version: typeof body.version === 'number' ? body.version : 1,
    missedFirings: typeof body.missed_firings === 'number' ? body.missed_firings : 0
  };
}

export function parseTasks(body: unknown): ITask[] | null {
  if (!Array.isArray(body)) {
    return null;
  }
  return body.map(parseTask).filter((t): t is ITask => t !== null);
}

export function parseFiring(body: unknown): ITaskRun | null {
  if (!isRecord(body) || typeof body.kind !== 'string') {
    return null;
  }
  return {
    kind: body.kind,
    runId: typeof body.run_id === 'string' ? body.run_id : null,
    status: typeof body.run_status === 'string' ? body.run_status : null,
    error: typeof body.error === 'string' ? body.error : null
  };
}

/** How the panel says a task's cadence. */
export function cadenceLabel(task: Pick<ITask, 'intervalSeconds' | 'status'>): string {
  if (task.status === 'paused') {
    return 'paused';
  }
  const seconds = task.intervalSeconds;
  if (seconds === null) {
    return 'by hand';
  }
  for (const [name, value] of Object.entries(CADENCE_SECONDS)) {
    if (value === seconds) {
      return name;
    }
  }
  return seconds % 3600 === 0 ? `every ${seconds / 3600} h` : `every ${Math.round(seconds / 60)} min`;
}

type TasksApi = Pick<KaizenApi, 'call'>;

export interface ITasksState {
  tasks: ITask[];
  /** The last firing started from this panel, by task id. */
  lastRun: Record<string, ITaskRun>;
  /** A member-safe sentence from the last failed action, or null. */
  message: string | null;
}

export class TasksModel extends Observable<ITasksState> {
  constructor(
    private readonly _api: TasksApi,
    readonly conversationId: string
  ) {
    super({ tasks: [], lastRun: {}, message: null });
  }

  private _failed(result: { ok: false; message: string }): void {
    this.set({ ...this._value, message: result.message });
  }

  async refresh(): Promise<void> {
    const result: Result<ITask[]> = await this._api.call(
      'GET',
      'tasks',
      undefined,
      'list your tasks',
      parseTasks
    );
    if (!result.ok) {
      this._failed(result);
      return;
    }
    const here = result.value.filter(t => t.conversationId === this.conversationId);
    this.set({ ...this._value, tasks: here });
  }

  /** A new task in this conversation; true when it was created. */
  async create(name: string, prompt: string, cadence: Cadence): Promise<boolean> {
    const body: Record<string, unknown> = {
      name: name.trim() || prompt.trim().slice(0, 80),
      prompt,
      conversation_id: this.conversationId
    };
    if (cadence !== 'manual') {
      body.interval_seconds = CADENCE_SECONDS[cadence];
    }
    const result = await this._api.call('POST', 'tasks', body, 'create the task', parseTask);
    if (!result.ok) {
      this._failed(result);
      return false;
    }
    await this.refresh();
    return true;
  }

  /** Run now (`run`) or as a safe test (`test`): the run appears in this conversation. */
  async run(taskId: string, mode: 'run' | 'test'): Promise<void> {
    const result = await this._api.call(
      'POST',
      `tasks/${encodeURIComponent(taskId)}/run`,
      { mode },
      mode === 'test' ? 'test the task' : 'run the task',
      parseFiring
    );
    if (!result.ok) {
      this._failed(result);
      return;
    }
    this.set({ ...this._value, lastRun: { ...this._value.lastRun, [taskId]: result.value } });
  }

  async setPaused(task: ITask, paused: boolean): Promise<void> {
    const result = await this._api.call(
      'PATCH',
      `tasks/${encodeURIComponent(task.id)}`,
      { status: paused ? 'paused' : 'active', version: task.version },
      paused ? 'pause the task' : 'resume the task',
      parseTask
    );
    if (!result.ok) {
      this._failed(result);
    }
    await this.refresh();
  }

  async remove(taskId: string): Promise<void> {
    const result = await this._api.call(
      'DELETE',
      `tasks/${encodeURIComponent(taskId)}`,
      undefined,
      'delete the task',
      () => true
    );
    if (!result.ok && result.status !== 404) {
      this._failed(result);
      return;
    }
    await this.refresh();
  }

  dismiss(): void {
    this.set({ ...this._value, message: null });
  }
}
