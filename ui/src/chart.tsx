// Small SVG charts (line/scatter over time, grouped bars). A chart library
// would be larger than all of this and the page needs only these two shapes.
// Each chart is a <figure> whose caption names it and whose SVG carries a
// text summary for screen readers.

export interface Point {
  x: number
  y: number
  label?: string
}

export interface Series {
  name: string
  cls: string
  points: Point[]
}

const W = 640
const PAD = { l: 64, r: 36, t: 12, b: 32 }

/** 4–6 round tick values covering [lo, hi], at least `minStep` apart. */
function ticks(lo: number, hi: number, n = 5, minStep = 0): number[] {
  if (!(hi > lo)) hi = lo + 1
  const raw = Math.max((hi - lo) / n, minStep)
  const mag = 10 ** Math.floor(Math.log10(raw))
  const step = [1, 2, 5, 10].map((m) => m * mag).find((s) => s >= raw) ?? raw
  // From the step at or below lo to the one at or above hi, so the axis
  // always covers every point.
  const out: number[] = []
  const last = Math.ceil(hi / step - 1e-9) * step
  for (let v = Math.floor(lo / step) * step; v <= last + step * 1e-9; v += step) out.push(v)
  return out
}

interface XYProps {
  title: string
  series: Series[]
  xFormat: (v: number) => string
  yFormat: (v: number) => string
  /** Join the points of a series with a line (else draw dots only). */
  line?: boolean
  height?: number
  empty?: string
}

export function XYChart({ title, series, xFormat, yFormat, line = false, height = 220, empty }: XYProps) {
  const all = series.flatMap((s) => s.points)
  if (all.length === 0) {
    return (
      <figure class="chart">
        <figcaption>{title}</figcaption>
        <p class="muted">{empty ?? 'No data yet.'}</p>
      </figure>
    )
  }
  const xs = all.map((p) => p.x)
  const ys = all.map((p) => p.y)
  let x0 = Math.min(...xs)
  let x1 = Math.max(...xs)
  if (x1 === x0) {
    x0 -= 1000
    x1 += 1000
  }
  const yt = ticks(0, Math.max(...ys) * 1.05 || 1)
  const y1 = yt[yt.length - 1]
  const H = height
  const sx = (x: number) => PAD.l + ((x - x0) / (x1 - x0)) * (W - PAD.l - PAD.r)
  const sy = (y: number) => H - PAD.b - (y / y1) * (H - PAD.t - PAD.b)
  // x is a time in ms and labels show whole seconds: no two ticks in one second.
  const xt = ticks(x0, x1, 4, 1000).filter((v) => v >= x0 && v <= x1)
  const summary = series
    .map((s) => {
      const last = s.points[s.points.length - 1]
      return `${s.name}: ${s.points.length} points${last ? `, last ${yFormat(last.y)}` : ''}`
    })
    .join('; ')
  return (
    <figure class="chart">
      <figcaption>{title}</figcaption>
      <svg viewBox={`0 0 ${W} ${H}`} role="img" aria-label={`${title}. ${summary}`}>
        {yt.map((v) => (
          <g>
            <line x1={PAD.l} x2={W - PAD.r} y1={sy(v)} y2={sy(v)} class="grid" />
            <text x={PAD.l - 6} y={sy(v) + 4} text-anchor="end" class="tick">
              {yFormat(v)}
            </text>
          </g>
        ))}
        {xt.map((v) => (
          <text x={sx(v)} y={H - PAD.b + 18} text-anchor="middle" class="tick">
            {xFormat(v)}
          </text>
        ))}
        {series.map((s) => (
          <g class={`series ${s.cls}`}>
            {line && s.points.length > 1 && (
              <polyline fill="none" points={s.points.map((p) => `${sx(p.x)},${sy(p.y)}`).join(' ')} />
            )}
            {s.points.map((p) => (
              <circle cx={sx(p.x)} cy={sy(p.y)} r={line ? 2 : 3.5}>
                <title>{`${p.label ? `${p.label}: ` : ''}${yFormat(p.y)} at ${xFormat(p.x)}`}</title>
              </circle>
            ))}
          </g>
        ))}
      </svg>
      <Legend series={series} />
    </figure>
  )
}

function Legend({ series }: { series: { name: string; cls: string }[] }) {
  return (
    <ul class="legend">
      {series.map((s) => (
        <li>
          <span class={`swatch ${s.cls}`} aria-hidden="true" /> {s.name}
        </li>
      ))}
    </ul>
  )
}

interface BarProps {
  title: string
  categories: string[]
  series: { name: string; cls: string; values: number[] }[]
  format: (v: number) => string
  empty?: string
}

/** Horizontal grouped bars: one row per category (a sandbox), one bar per series. */
export function BarChart({ title, categories, series, format, empty }: BarProps) {
  if (categories.length === 0) {
    return (
      <figure class="chart">
        <figcaption>{title}</figcaption>
        <p class="muted">{empty ?? 'No data yet.'}</p>
      </figure>
    )
  }
  const bar = 9
  const row = bar * series.length + 8
  const H = PAD.t + row * categories.length + PAD.b
  const L = 130
  const max = Math.max(1, ...series.flatMap((s) => s.values))
  const xt = ticks(0, max * 1.05, 4)
  const x1 = xt[xt.length - 1]
  const sx = (v: number) => L + (v / x1) * (W - L - PAD.r)
  return (
    <figure class="chart">
      <figcaption>{title}</figcaption>
      <svg viewBox={`0 0 ${W} ${H}`} role="img" aria-label={`${title}: ${categories.length} sandboxes`}>
        {xt.map((v) => (
          <g>
            <line x1={sx(v)} x2={sx(v)} y1={PAD.t} y2={H - PAD.b} class="grid" />
            <text x={sx(v)} y={H - PAD.b + 16} text-anchor="middle" class="tick">
              {format(v)}
            </text>
          </g>
        ))}
        {categories.map((c, i) => (
          <g>
            <text x={L - 6} y={PAD.t + i * row + row / 2 + 2} text-anchor="end" class="tick mono">
              {c}
            </text>
            {series.map((s, j) => (
              <rect class={`bar ${s.cls}`} x={L} y={PAD.t + i * row + j * bar} width={Math.max(0, sx(s.values[i]) - L)} height={bar - 1}>
                <title>{`${c} ${s.name}: ${format(s.values[i])}`}</title>
              </rect>
            ))}
          </g>
        ))}
      </svg>
      <Legend series={series} />
    </figure>
  )
}
