// Run the JupyterLab extension builder CLI with the given arguments, e.g.
//   node scripts/labextension.mjs build .
//
// JupyterLab >= 4.6 builds extensions with `jupyter-builder` (the jupyter_builder
// Python package); older JupyterLab 4 releases with `jupyter labextension`. Both are
// console scripts of the Python environment, which is not on PATH when jlpm is run
// as `../.venv/bin/jlpm` without activating the environment. So this looks, in
// order: beside the jlpm that started this script (jlpm runs the
// yarn.js shipped inside the Python package, whose environment's bin/ holds the CLI),
// then on PATH.
import { spawnSync } from 'node:child_process';
import { accessSync, constants, copyFileSync, existsSync, readFileSync } from 'node:fs';
import path from 'node:path';
import process from 'node:process';

const args = process.argv.slice(2);
const isWindows = process.platform === 'win32';
const suffixes = isWindows ? ['.exe', '.cmd', '.bat', ''] : [''];

function executable(file) {
  for (const suffix of suffixes) {
    try {
      accessSync(file + suffix, constants.X_OK);
      return file + suffix;
    } catch {
      // not here
    }
  }
  return null;
}

function onPath(name) {
  for (const dir of (process.env.PATH ?? '').split(path.delimiter)) {
    const found = dir && executable(path.join(dir, name));
    if (found) {
      return found;
    }
  }
  return null;
}

function jlpmYarnJs() {
  // Yarn runs scripts with npm_execpath pointing at a small shim script that execs
  // node on the yarn.js it was started from (for jlpm: the one inside the Python
  // package). Read that path out of the shim; accept npm_execpath being yarn.js too.
  const execpath = process.env.npm_execpath;
  if (!execpath) {
    return null;
  }
  if (/\.c?js$/.test(execpath)) {
    return execpath;
  }
  try {
    const shim = readFileSync(execpath, 'utf8');
    const match = shim.length < 4096 && /["']([^"']+\.c?js)["']/.exec(shim);
    return match ? match[1] : null;
  } catch {
    return null;
  }
}

function besideJlpm(name) {
  const yarnJs = jlpmYarnJs();
  if (!yarnJs) {
    return null;
  }
  let dir = path.dirname(path.resolve(yarnJs));
  for (;;) {
    const found =
      executable(path.join(dir, 'bin', name)) ?? executable(path.join(dir, 'Scripts', name));
    if (found) {
      return found;
    }
    const parent = path.dirname(dir);
    if (parent === dir) {
      return null;
    }
    dir = parent;
  }
}

function locate() {
  for (const find of [besideJlpm, onPath]) {
    const builder = find('jupyter-builder');
    if (builder) {
      return [builder, args];
    }
    const labextension = find('jupyter-labextension');
    if (labextension) {
      return [labextension, args];
    }
  }
  return null;
}

const found = locate();
if (!found) {
  console.error(
    'Cannot find `jupyter-builder` or `jupyter-labextension`: install JupyterLab 4 ' +
      '(pip install "jupyterlab>=4,<5") in the Python environment that runs jlpm, ' +
      'or put that environment on PATH.'
  );
  process.exit(1);
}
const [command, commandArgs] = found;
console.log(`> ${path.basename(command)} ${commandArgs.join(' ')}`);
const result = spawnSync(command, commandArgs, { stdio: 'inherit', shell: isWindows });
if (result.error) {
  console.error(result.error.message);
  process.exit(1);
}
if (result.status === 0 && commandArgs[0] === 'build') {
  copyInstallJson(commandArgs[commandArgs.length - 1]);
}
process.exit(result.status ?? 1);

// The built panel carries install.json, which tells `jupyter labextension list` (and its
// uninstall hint) which Python package ships it. The builder does not copy it; a separate
// wheel shared-data entry for it would be written by an editable install through
// `jupyter labextension develop`'s symlink into this very directory, and then packed twice.
function copyInstallJson(extensionDir) {
  const source = path.join(extensionDir, 'install.json');
  const pkg = JSON.parse(readFileSync(path.join(extensionDir, 'package.json'), 'utf8'));
  const outputDir = pkg.jupyterlab?.outputDir;
  if (outputDir && existsSync(source)) {
    copyFileSync(source, path.join(extensionDir, outputDir, 'install.json'));
  }
}
