import './base.css';
import './memberfiles.css';
import './tasks.css';
import './documents.css';
