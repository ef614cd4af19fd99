import { ServerConnection } from '@jupyterlab/services';
import { ReactWidget, refreshIcon } from '@jupyterlab/ui-components';
import React, { useCallback, useEffect, useRef, useState } from 'react';

import { AgentsResult, fetchAgents, IAgent } from './api';

type LoadState = { phase: 'loading' } | AgentsResult;

interface IAgentsViewProps {
  settings: ServerConnection.ISettings;
}

function AgentList({ agents }: { agents: IAgent[] }): JSX.Element {
  if (agents.length === 0) {
    return <p className="jp-Kaizen-empty">No agents are available to you yet.</p>;
  }
  return (
    <ul className="jp-Kaizen-agentList" aria-label="Kaizen agents">
      {agents.map(agent => (
        <li key={agent.id} className="jp-Kaizen-agent" data-agent-id={agent.id}>
          <span className="jp-Kaizen-agentName">{agent.name}</span>
          {agent.mode && <span className="jp-Kaizen-agentMode">{agent.mode}</span>}
        </li>
      ))}
    </ul>
  );
}

/** The agent roster, loaded once when shown and again on "Refresh". */
export function AgentsView({ settings }: IAgentsViewProps): JSX.Element {
  const [state, setState] = useState<LoadState>({ phase: 'loading' });
  const latest = useRef(0);

  const load = useCallback(() => {
    const request = ++latest.current;
    setState({ phase: 'loading' });
    void fetchAgents(settings).then(result => {
      // A slower, older request must not overwrite a newer answer.
      if (request === latest.current) {
        setState(result);
      }
    });
  }, [settings]);

  useEffect(() => {
    load();
    return () => {
      latest.current++;
    };
  }, [load]);

  let body: JSX.Element;
  if ('phase' in state) {
    body = <p className="jp-Kaizen-status">Loading agents…</p>;
  } else if (state.ok) {
    body = <AgentList agents={state.agents} />;
  } else {
    body = (
      <p className="jp-Kaizen-error" role="alert">
        {state.message}
      </p>
    );
  }

  return (
    <div className="jp-Kaizen-body">
      <div className="jp-Kaizen-header">
        <h2 className="jp-Kaizen-title">Agents</h2>
        <button
          type="button"
          className="jp-Kaizen-refresh"
          title="Refresh the agent list"
          aria-label="Refresh the agent list"
          disabled={'phase' in state}
          onClick={load}
        >
          <refreshIcon.react tag="span" elementSize="normal" />
        </button>
      </div>
      {body}
    </div>
  );
}

/** The Kaizen side panel. */
export class KaizenPanel extends ReactWidget {
  constructor(settings: ServerConnection.ISettings = ServerConnection.makeSettings()) {
    super();
    this._settings = settings;
    this.addClass('jp-Kaizen-panel');
  }

  protected render(): JSX.Element {
    return <AgentsView settings={this._settings} />;
  }

  private readonly _settings: ServerConnection.ISettings;
}
