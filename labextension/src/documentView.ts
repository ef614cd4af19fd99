/**
 * A main-area view of one cited document version: its passages in order, the cited one
 * highlighted and scrolled into view. Its text comes from Kaizen (the version the answer
 * cited, read as the member now), so a document deleted or unshared since says it is no
 * longer available instead of showing anything. A document added from a Jupyter path offers
 * to open that file in JupyterLab (the owner's own file; others are not told the path).
 */
import { Widget } from '@lumino/widgets';

import { KaizenApi } from './api';
import { ICitation, IDocumentPassages, openCitation, versionNote } from './documents';
import { element } from './dom';

export interface IDocumentViewOptions {
  api: KaizenApi;
  /** Open a file of the Jupyter contents tree in JupyterLab. */
  openPath?: (path: string) => void;
}

/** The widget id of the view of one document version (one view per version). */
export function documentViewId(citation: ICitation): string {
  return `kaizen-document-${citation.documentId}-v${citation.version}`;
}

export class DocumentView extends Widget {
  constructor(citation: ICitation, label: string, private readonly _options: IDocumentViewOptions) {
    super();
    this.id = documentViewId(citation);
    this.addClass('jp-Kaizen-documentView');
    this.title.label = label || 'Cited document';
    this.title.caption = 'A document Kaizen cited';
    this.title.closable = true;
    this._citation = citation;
  }

  /** Load (or reload: access may have changed) and show `citation`'s passage. */
  async open(citation: ICitation): Promise<void> {
    this._citation = citation;
    const loading = ++this._loads;
    this.node.dataset.state = 'loading';
    this.node.replaceChildren(element('p', 'jp-Kaizen-status', 'Opening the cited document…'));
    const result = await openCitation(this._options.api, citation);
    if (loading !== this._loads) {
      return;
    }
    if (!result.ok) {
      this.node.dataset.state = result.status === 404 ? 'unavailable' : 'error';
      const error = element('p', 'jp-Kaizen-error', result.message);
      error.setAttribute('role', 'alert');
      this.node.replaceChildren(error);
      return;
    }
    this._render(result.value);
  }

  private _render(found: IDocumentPassages): void {
    this.title.label = `${found.title} (v${found.version})`;
    const header = element('header', 'jp-Kaizen-documentHeader');
    header.append(
      element('h2', 'jp-Kaizen-documentTitle', found.title),
      element('p', 'jp-Kaizen-documentVersion', versionNote(found))
    );
    const source = found.sourcePath;
    if (source && this._options.openPath) {
      const open = element('button', 'jp-Kaizen-documentSource', `Open ${source} in JupyterLab`);
      (open as HTMLButtonElement).type = 'button';
      open.dataset.path = source;
      open.addEventListener('click', () => this._options.openPath?.(source));
      header.append(open);
    }
    const body = element('div', 'jp-Kaizen-passages');
    let cited: HTMLElement | null = null;
    for (const passage of found.passages) {
      const section = element('section', 'jp-Kaizen-passage');
      section.dataset.chunkId = passage.chunkId;
      section.append(
        element('h3', 'jp-Kaizen-passageLocator', passage.locator),
        element('pre', 'jp-Kaizen-passageText', passage.text)
      );
      if (passage.chunkId === this._citation.chunkId) {
        section.classList.add('jp-Kaizen-passage-cited');
        section.dataset.cited = 'true';
        cited = section;
      }
      body.append(section);
    }
    this.node.replaceChildren(header);
    if (!cited && this._citation.chunkId) {
      const missing = element('p', 'jp-Kaizen-error', 'The cited passage is not in this version.');
      missing.setAttribute('role', 'alert');
      this.node.append(missing);
    }
    this.node.append(body);
    this.node.dataset.state = 'ready';
    this._cited = cited;
    this._scrollToCited();
  }

  protected onAfterShow(): void {
    this._scrollToCited();
  }

  private _scrollToCited(): void {
    const cited = this._cited;
    if (cited && this.isVisible) {
      requestAnimationFrame(() => cited.scrollIntoView({ block: 'center' }));
    }
  }

  private _citation: ICitation;
  private _cited: HTMLElement | null = null;
  private _loads = 0;
}
