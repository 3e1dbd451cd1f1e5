// Vite builds the dashboard into dist/, which the daemon serves at /ui/.
//
// `npm run dev` proxies /v1 to a running daemon so the page can be worked on
// without installing it: set FORKVM_DEV_URL (http://127.0.0.1:PORT) and
// FORKVM_TOKEN; the proxy adds the bearer token the browser does not have.
import { defineConfig } from 'vite'

const target = process.env.FORKVM_DEV_URL
const token = process.env.FORKVM_TOKEN
const proxy = target
  ? { '/v1': { target, changeOrigin: true, headers: token ? { authorization: `Bearer ${token}` } : {} } }
  : undefined

export default defineConfig({
  base: '/ui/',
  // Preact's automatic JSX runtime (the same setting as tsconfig.json).
  oxc: { jsx: { runtime: 'automatic', importSource: 'preact' } },
  build: {
    outDir: 'dist',
    emptyOutDir: true,
    // No source maps: they would ship the sources' absolute paths.
    sourcemap: false,
    // xterm.js and dagre are large; one warning threshold that fits them.
    chunkSizeWarningLimit: 1024,
    // Every asset is a file under /ui/assets/: no data: URLs to audit.
    assetsInlineLimit: 0,
  },
  server: { host: '127.0.0.1', proxy },
  preview: { host: '127.0.0.1', proxy },
})
