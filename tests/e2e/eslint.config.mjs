// Catches what `node --check` cannot before the suite runs: a name used
// but never defined or imported (a test file that fails only when its
// hook runs, 30 minutes into `make test`).
import globals from 'globals';

export default [
  {
    files: ['**/*.mjs'],
    ignores: ['node_modules/**'],
    languageOptions: { ecmaVersion: 'latest', sourceType: 'module', globals: { ...globals.node } },
    rules: { 'no-undef': 'error' },
  },
];
