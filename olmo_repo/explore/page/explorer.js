// The explorer page: the positions that one or two models assign to a prompt's tokens, per RePo layer and head.
// Served, one "Show positions" asks /api/positions for every RePo layer and head at once (a model without
// RePo layers: /api/tokens), so switching layer or head redraws without a request. In a static export the
// same answers are embedded in the page (config.results) and there is no prompt box to submit.
"use strict";

const config = JSON.parse(document.getElementById("explorer-config").textContent);
const models = config.models;
const $ = (id) => document.getElementById(id);
const COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
  "#bcbd22", "#17becf"];
let results = config.results;  // one answer ({error} on failure) per model; null before the first prompt

function escapeHtml(text) {
  return text.replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;").replace(/"/g, "&quot;");
}

// A token as shown on the axis and in hover labels (plotly reads them as HTML): visible whitespace.
function showToken(token) {
  const visible = token.replace(/\n/g, "⏎").replace(/\t/g, "⇥");
  return escapeHtml(visible.trim() === "" ? visible.replace(/ /g, "␣") : visible);
}

function setStatus(text, isError = false) {
  $("status").textContent = text;
  $("status").className = isError ? "error" : "";
}

function setup() {
  for (const [i, m] of models.entries()) {
    const item = document.createElement("li");
    const replaced = m.positions === "learned" ? "" : `, learned positions replaced by ${m.positions === "index" ? "the token index (as RoPE)" : "one constant position (as NoPE)"}`;
    item.textContent = `${m.name}: ${m.repo_layers.length ? `RePo layers ${m.repo_layers.join(", ")}` : "no RePo layer"}, ${m.n_heads === m.n_query_heads ? `${m.n_heads} heads` : `${m.n_heads} key/value heads (a position each, shared by ${m.n_query_heads / m.n_heads} query heads)`}${replaced}`;
    item.value = i;
    $("models").append(item);
  }
  const layers = [...new Set(models.flatMap((m) => m.repo_layers))].sort((a, b) => a - b);
  for (const layer of layers) {
    const owners = models.flatMap((m, i) => (m.repo_layers.includes(layer) ? [i] : []));
    const only = owners.length < models.length ? ` (RePo in model ${owners.join(", ")} only)` : "";
    $("layer").add(new Option(`layer ${layer}${only}`, layer));
  }
  $("head").add(new Option("all heads", "all"));
  for (let h = 0; h < Math.max(...models.map((m) => m.n_heads)); h++) $("head").add(new Option(`head ${h}`, h));
  const limit = Math.min(...models.map((m) => m.max_tokens));
  $("max-tokens").max = limit;
  $("max-tokens").value = limit;
  $("layer").addEventListener("change", render);
  $("head").addEventListener("change", render);
  if (results) {  // static export
    $("prompt").value = config.prompt;
    $("prompt").readOnly = true;
    $("run").hidden = true;
    $("max-tokens-label").hidden = true;
  } else {
    $("controls").addEventListener("submit", (event) => { event.preventDefault(); run(); });
    $("prompt").addEventListener("keydown", (event) => {
      if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) { event.preventDefault(); run(); }
    });
  }
  render();
}

async function post(path, body) {
  const response = await fetch(path, {
    method: "POST", headers: {"Content-Type": "application/json"}, body: JSON.stringify(body),
  });
  let data;
  try { data = await response.json(); } catch { data = {}; }
  return response.ok ? data : {error: data.error || `HTTP ${response.status} ${response.statusText}`};
}

async function run() {
  const prompt = $("prompt").value, max_tokens = Number($("max-tokens").value);
  setStatus("computing…");
  $("run").disabled = true;
  try {
    results = await Promise.all(models.map((m, model) =>
      post(m.repo_layers.length ? "api/positions" : "api/tokens", {prompt, model, max_tokens})));
    setStatus("");
  } catch (error) {
    setStatus(`request failed: ${error}`, true);
    return;
  } finally {
    $("run").disabled = false;
  }
  render();
}

function fraction(x) { return `${(100 * x).toFixed(1)}%`; }

function statsHtml(m, r, li, shown) {
  const spans = r.spans[li], patterns = r.patterns[li];
  const row = (name, span, p) =>
    `<tr><td>${name}</td><td>${span.toFixed(3)}</td><td>${fraction(p.constant)}</td>` +
    `<td>${fraction(p.monotonic)}</td><td>${fraction(p.hybrid)}</td></tr>`;
  const rows = shown.map((hi) => row(`head ${r.heads[hi]}`, spans[hi], patterns.heads[hi]));
  const mean = spans.reduce((a, b) => a + b, 0) / spans.length;
  rows.push(row("all heads", mean, patterns.all));
  const T = r.tokens.length;
  const n = Math.floor(T / r.chunk);
  const chunks = n === 0 ? `one chunk of all ${T} tokens` : `${n} chunk${n > 1 ? "s" : ""} of ${r.chunk} tokens per head`;
  const s = r.spread[li];
  return `<table><tr><th></th><th>span</th><th>constant</th><th>monotonic</th><th>hybrid</th></tr>${rows.join("")}</table>` +
    `<p class="caption">span: max − min of a head's positions (all heads: their mean); shares of the chunks ` +
    `(${chunks}, eps ${r.eps}) that are constant, monotonic or hybrid (all heads: pooled).</p>` +
    `<p class="caption spread">layer ${r.layers[li]}, all heads: std ${s.std.toFixed(3)}, 5th–95th percentile ` +
    `${s.p05.toFixed(3)} … ${s.p95.toFixed(3)}, rank correlation with the token index ${s.rank_corr.toFixed(3)} ` +
    `(1: RoPE's order).</p>`;
}

function tokensHtml(m, r) {
  const chips = r.tokens.map((t, i) =>
    `<span class="tok" title="token ${i}, id ${r.token_ids[i]}">${showToken(t)}<i>${r.token_ids[i]}</i></span>`);
  return `<h3>model ${m}: ${r.tokens.length} token ids</h3><div class="tokens">${chips.join("")}</div>`;
}

function render() {
  const layer = Number($("layer").value), head = $("head").value;
  const traces = [], notes = [], stats = [], tokens = [];
  for (const [m, r] of (results || []).entries()) {
    const name = escapeHtml(models[m].name);
    if (r.error) { notes.push(`model ${m} (${name}): ${escapeHtml(r.error)}`); continue; }
    if (r.truncated) {
      notes.push(`model ${m}: the prompt has ${r.prompt_tokens} tokens; only the first ${r.tokens.length} are shown (max tokens).`);
    }
    const x = r.tokens.map((_, i) => i), text = r.tokens.map(showToken);
    const mode = models[m].layer_modes[layer];
    const style = {dash: m === 0 ? "solid" : "dash", symbol: m === 0 ? "circle" : "square"};
    stats.push(`<h3>model ${m}: ${name}, layer ${layer}</h3>`);
    if (mode === "repo") {
      const li = r.layers.indexOf(layer);
      const shown = r.heads.flatMap((h, hi) => (head === "all" || h === Number(head) ? [hi] : []));
      if (!shown.length) notes.push(`model ${m} has no head ${head}.`);
      for (const hi of shown) {
        const h = r.heads[hi], color = COLORS[h % COLORS.length];
        traces.push({
          x, y: r.positions[li][hi], text, type: "scatter", mode: "lines+markers",
          name: `model ${m} · head ${h}`, meta: {model: m, layer, head: h},
          line: {color, dash: style.dash, width: 1.5}, marker: {color, symbol: style.symbol, size: 6},
          hovertemplate: "%{text}<br>token %{x}<br>position %{y:.4f}<extra>%{fullData.name}</extra>",
        });
      }
      stats.push(shown.length ? statsHtml(m, r, li, shown) : "");
    } else if (mode === "rope") {
      traces.push({
        x, y: x, text, type: "scatter", mode: "lines+markers", name: `model ${m} · RoPE (position = index)`,
        meta: {model: m, layer, head: null}, line: {color: "#999", dash: "dot"}, marker: {color: "#999", symbol: style.symbol, size: 5},
        hovertemplate: "%{text}<br>token %{x}<br>position %{y}<extra>%{fullData.name}</extra>",
      });
      stats.push(`<p>layer ${layer} uses RoPE: every head's position is the token index.</p>`);
    } else {
      stats.push(`<p>layer ${layer} is NoPE: no positions.</p>`);
    }
    tokens.push(tokensHtml(m, r));
  }
  $("notes").innerHTML = notes.map((n) => `<p class="note">${n}</p>`).join("");
  $("stats").innerHTML = stats.join("");
  $("tokens").innerHTML = tokens.join("");
  if (!results) setStatus("Type a prompt and press “Show positions”.");
  const axisTokens = (results || []).find((r) => !r.error)?.tokens || [];
  const step = Math.max(1, Math.ceil(axisTokens.length / 64));  // at most 64 token labels on the axis
  const tickvals = axisTokens.flatMap((_, i) => (i % step === 0 ? [i] : []));
  Plotly.react("plot", traces, {
    height: 520, margin: {t: 30, r: 10}, hovermode: "closest", legend: {orientation: "h", y: -0.25},
    xaxis: {title: {text: "token"}, tickmode: "array", tickvals, ticktext: tickvals.map((i) => showToken(axisTokens[i])),
      tickangle: -60, automargin: true, zeroline: false},
    yaxis: {title: {text: "position"}, automargin: true},
  }, {displaylogo: false, responsive: true});
}

setup();
