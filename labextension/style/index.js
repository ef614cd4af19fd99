import './base.css';
import './memberfiles.css';
