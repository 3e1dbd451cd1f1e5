// Numbers as people read them. Kept apart so every view says sizes and times
// the same way.

export function ms(v: number | null | undefined): string {
  if (v == null || !Number.isFinite(v)) return '–'
  if (v < 10) return `${v.toFixed(1)} ms`
  if (v < 1000) return `${Math.round(v)} ms`
  return `${(v / 1000).toFixed(v < 10_000 ? 2 : 1)} s`
}

export function bytes(v: number | null | undefined): string {
  if (v == null || !Number.isFinite(v)) return '–'
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB']
  let i = 0
  let x = v
  while (x >= 1024 && i < units.length - 1) {
    x /= 1024
    i++
  }
  return i === 0 ? `${x} B` : `${x.toFixed(x < 10 ? 1 : 0)} ${units[i]}`
}

/** A value already in MiB, for chart axes (round numbers stay round). */
export const mib = (v: number) => `${Number.isInteger(v) ? v : v.toFixed(1)} MiB`

export const kib = (v: number | null | undefined) => (v == null ? '–' : bytes(v * 1024))

export function ago(iso: string | number, now = Date.now()): string {
  const t = typeof iso === 'number' ? iso : Date.parse(iso)
  if (!Number.isFinite(t)) return '–'
  const s = Math.max(0, Math.round((now - t) / 1000))
  if (s < 60) return `${s}s ago`
  if (s < 3600) return `${Math.floor(s / 60)}m ago`
  if (s < 86400) return `${Math.floor(s / 3600)}h ago`
  return `${Math.floor(s / 86400)}d ago`
}

export function clock(t: number): string {
  const d = new Date(t)
  const p = (n: number) => String(n).padStart(2, '0')
  return `${p(d.getHours())}:${p(d.getMinutes())}:${p(d.getSeconds())}`
}
