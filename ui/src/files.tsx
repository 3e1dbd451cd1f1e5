// A sandbox's files: browse a directory (GET .../fs/list?depth=1), download a
// file (a plain link to GET .../files?path=, which the browser fetches with
// the login cookie), upload into the directory shown (PUT .../files?path=).
import { useEffect, useState } from 'preact/hooks'
import { api } from './api'
import { bytes } from './format'
import type { EntryInfo } from './types'

const join = (dir: string, name: string) => (dir.endsWith('/') ? dir + name : `${dir}/${name}`)
const up = (dir: string) => dir.replace(/\/[^/]+\/?$/, '') || '/'

export function SandboxFiles({ id }: { id: string }) {
  const [dir, setDir] = useState('/root')
  const [typed, setTyped] = useState('/root')
  const [entries, setEntries] = useState<EntryInfo[] | null>(null)
  const [error, setError] = useState<string | null>(null)
  const [note, setNote] = useState('')
  const [reload, setReload] = useState(0)

  useEffect(() => {
    let stale = false
    setEntries(null)
    setError(null)
    api.listDir(id, dir).then(
      (e) => {
        if (!stale) setEntries(e.sort((a, b) => (a.kind === 'dir') !== (b.kind === 'dir') ? (a.kind === 'dir' ? -1 : 1) : a.name.localeCompare(b.name)))
      },
      (err) => !stale && setError((err as Error).message),
    )
    return () => {
      stale = true
    }
  }, [id, dir, reload])

  const go = (p: string) => {
    setDir(p)
    setTyped(p)
  }
  const onUpload = async (e: Event) => {
    const input = e.currentTarget as HTMLInputElement
    const files = [...(input.files ?? [])]
    for (const f of files) {
      try {
        const r = await api.upload(id, join(dir, f.name), f)
        setNote(`Uploaded ${r.path} (${bytes(r.size)})`)
      } catch (err) {
        setNote(`Upload of ${f.name} failed: ${(err as Error).message}`)
      }
    }
    input.value = ''
    setReload((n) => n + 1)
  }

  return (
    <div class="files">
      <form
        class="files-bar"
        onSubmit={(e) => {
          e.preventDefault()
          go(typed.trim() || '/')
        }}
      >
        <button type="button" onClick={() => go(up(dir))} disabled={dir === '/'}>
          Up
        </button>
        <input aria-label="Directory" class="mono" value={typed} onInput={(e) => setTyped(e.currentTarget.value)} />
        <button type="submit">Go</button>
        <label class="button">
          Upload…
          <input type="file" multiple class="visually-hidden" onChange={onUpload} />
        </label>
      </form>
      <p class="muted" role="status">
        {note}
      </p>
      {error && <p class="error">{error}</p>}
      {entries === null && !error && <p class="muted">Loading…</p>}
      {entries && (
        <table class="file-table">
          <caption class="visually-hidden">Files in {dir}</caption>
          <thead>
            <tr>
              <th scope="col">Name</th>
              <th scope="col">Size</th>
              <th scope="col">Permissions</th>
              <th scope="col">Owner</th>
              <th scope="col">Modified</th>
            </tr>
          </thead>
          <tbody>
            {entries.map((e) => (
              <tr key={e.path}>
                <td class="mono">
                  {e.kind === 'dir' ? (
                    <button type="button" class="linklike" onClick={() => go(e.path)}>
                      {e.name}/
                    </button>
                  ) : e.kind === 'file' ? (
                    <a href={api.fileUrl(id, e.path)} download={e.name}>
                      {e.name}
                    </a>
                  ) : (
                    <span>
                      {e.name}
                      {e.symlink_target ? ` → ${e.symlink_target}` : ''}
                    </span>
                  )}
                </td>
                <td>{e.kind === 'file' ? bytes(e.size) : ''}</td>
                <td class="mono">{e.permissions}</td>
                <td>
                  {e.owner}:{e.group}
                </td>
                <td>{new Date(e.modified_ns / 1e6).toLocaleString()}</td>
              </tr>
            ))}
          </tbody>
        </table>
      )}
      {entries?.length === 0 && <p class="muted">Empty directory.</p>}
    </div>
  )
}
