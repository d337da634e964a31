// beamserve's translation page: the server's own API (/languages, /frontend/settings, /v1/translate,
// /translate_file for files), no library and no build step. Every answer is written as text, never as markup.
"use strict";

const $ = (id) => document.getElementById(id);
const DEBOUNCE_MS = 500;
let names = {}; // language code -> name
let targets = {}; // source code -> the codes it translates into
let charLimit = 0;
let timer = null;
let sent = 0; // the number of the latest request: an older answer arriving late is dropped
let lastDetected = ""; // the language the server detected in the text last translated

function option(code) {
  const o = document.createElement("option");
  o.value = code;
  o.textContent = `${names[code] || code} (${code})`;
  return o;
}

function fillTargets() {
  const source = $("source").value;
  const wanted = $("target").value;
  const codes = source === "auto" ? Object.keys(names).filter((c) => Object.values(targets).some((t) => t.includes(c)))
    : targets[source] || [];
  $("target").replaceChildren(...codes.map(option));
  if (codes.includes(wanted)) $("target").value = wanted;
}

function showCount() {
  const n = $("text").value.length;
  $("count").textContent = `${n} / ${charLimit} characters`;
  $("count").classList.toggle("over", n > charLimit);
}

function message(body, status) {
  // The API's own message: {"error": code, "detail": text or [{loc, msg}]}.
  const detail = body && body.detail;
  if (typeof detail === "string") return detail;
  if (Array.isArray(detail)) return detail.map((d) => `${(d.loc || []).slice(1).join(".")}: ${d.msg}`).join("; ");
  return `the server answered ${status}`;
}

async function translate() {
  const text = $("text").value;
  const mine = ++sent;
  $("error").textContent = "";
  if (!text.trim()) {
    $("translation").value = "";
    $("detected").textContent = "";
    $("alternatives-section").hidden = true;
    $("origin").textContent = "";
    $("approve").hidden = true;
    $("suggestions-section").hidden = true;
    return;
  }
  const alternatives = Number($("alternatives").value);
  const body = { texts: [text], target: $("target").value };
  if ($("source").value !== "auto") body.source = $("source").value;
  if ($("html").checked) body.tag_handling = "html";
  if (alternatives) Object.assign(body, { num_hypotheses: alternatives + 1, beam_size: Math.max(4, alternatives + 1) });
  if ($("memory").value) body.memory = $("fuzzy").checked ? { id: $("memory").value, min_match: 0.75 } : $("memory").value;
  const headers = keyed({ "content-type": "application/json" });
  $("go").disabled = true;
  try {
    const r = await fetch("v1/translate", { method: "POST", headers, body: JSON.stringify(body) });
    const answer = await r.json().catch(() => null);
    if (mine !== sent) return;
    if (!r.ok) {
      $("error").textContent = message(answer, r.status);
      return;
    }
    const [t] = answer.translations;
    show(t.text, body.target);
    sureness(t.confidence);
    remembered(t);
    const found = t.detected_source;
    lastDetected = found ? found.language : "";
    $("detected").textContent = found ? `Detected: ${names[found.language] || found.language} (${Math.round(found.confidence * 100)}%)` : "";
    const others = (t.hypotheses || []).slice(1);
    $("alternatives-list").replaceChildren(...others.map((h) => {
      const li = document.createElement("li");
      li.textContent = h;
      return li;
    }));
    $("alternatives-section").hidden = others.length === 0;
  } catch (e) {
    if (mine === sent) $("error").textContent = `the server could not be reached (${e.message})`;
  } finally {
    if (mine === sent) $("go").disabled = false;
  }
}

// Languages written right to left, among those NLLB and OPUS-MT serve (the API's codes).
const RTL = new Set(["ar", "arb", "arz", "ary", "acm", "apc", "ajp", "aeb", "ars", "acq", "fa", "pes", "prs", "he",
  "ur", "yi", "ydd", "ps", "pbt", "sd", "ug", "dv", "ckb", "azb", "ks", "syr"]);

// The translation in its language and direction, and said by a screen reader (a read-only field is not).
function show(text, target) {
  const code = target.split("-")[0];
  for (const el of [$("translation"), $("announce")]) {
    el.lang = target;
    el.dir = RTL.has(code) ? "rtl" : "ltr";
  }
  $("translation").value = text;
  $("announce").textContent = text;
}

// The model's confidence in the translation (the geometric mean of its tokens' probabilities); under
// LOW_CONFIDENCE the translation is worth checking (docs/benchmarks.md#confidence).
const LOW_CONFIDENCE = 0.6;
function sureness(confidence) {
  const known = typeof confidence === "number";
  $("confidence").textContent = known
    ? `Model confidence: ${Math.round(confidence * 100)}%${confidence < LOW_CONFIDENCE ? " (low: worth checking)" : ""}`
    : "";
  $("confidence").classList.toggle("low", known && confidence < LOW_CONFIDENCE);
}

// Where the translation came from, with a translation memory chosen: the memory's units or the model.
function remembered(t) {
  const matches = t.memory_matches || [];
  const found = matches.filter((m) => m !== null).length;
  $("origin").textContent = !found ? ""
    : found === matches.length ? "From the translation memory"
      : `${found} of ${matches.length} sentences from the translation memory`;
  $("approve").hidden = !$("memory").value || !t.text || found === matches.length;
  // Units near a sentence that did not answer it: shown to edit from, never as the translation.
  const near = (t.memory_suggestions || []).filter((s) => s !== null);
  $("suggestions-list").replaceChildren(...near.map((s) => {
    const li = document.createElement("li");
    const source = document.createElement("span");
    source.textContent = s.source;
    source.lang = $("source").value === "auto" ? "" : $("source").value;
    const target = document.createElement("span");
    target.textContent = s.target;
    target.lang = $("target").value;
    li.append(source, " \u2192 ", target, ` (${Math.round(s.match * 100)}% match)`);
    return li;
  }));
  $("suggestions-section").hidden = near.length === 0;
}

function keyed(headers) {
  if ($("api-key").value) headers.authorization = `Bearer ${$("api-key").value}`;
  return headers;
}

// The memories of the key (or, without keys, of the server) to choose from.
async function memories() {
  const r = await fetch("v1/memories", { headers: keyed({}) });
  if (!r.ok) return;
  const chosen = $("memory").value;
  const none = document.createElement("option");
  none.value = "";
  none.textContent = "None";
  $("memory").replaceChildren(none, ...(await r.json()).memories.map((m) => {
    const o = document.createElement("option");
    o.value = m.memory_id;
    o.textContent = `${m.name} (${m.source} to ${m.target}, ${m.units} units)`;
    return o;
  }));
  $("memory").value = chosen;
}

// The text and its translation added to the chosen memory: the next time, the memory answers it.
async function approve() {
  const unit = { source: $("text").value.trim(), target: $("translation").value.trim() };
  const r = await fetch(`v1/memories/${$("memory").value}/units`, {
    method: "POST", headers: keyed({ "content-type": "application/json" }), body: JSON.stringify({ units: [unit] }),
  });
  const answer = await r.json().catch(() => null);
  if (!r.ok) {
    $("error").textContent = message(answer, r.status);
    return;
  }
  $("origin").textContent = "Approved into the translation memory";
  $("approve").hidden = true;
  memories();
}

function later() {
  showCount();
  clearTimeout(timer);
  if ($("live").checked) timer = setTimeout(translate, DEBOUNCE_MS);
}

function swap() {
  // The translation becomes the text; a detected source becomes the target.
  const source = $("source").value === "auto" ? lastDetected : $("source").value;
  if (!source || !(targets[$("target").value] || []).includes(source)) {
    $("error").textContent = "no model translates back: pick the languages instead";
    return;
  }
  const target = $("target").value;
  $("source").value = target;
  fillTargets();
  $("target").value = source;
  $("text").value = $("translation").value;
  $("translation").value = "";
  later();
}

async function translateFile() {
  // LibreTranslate's file route: the file translated, answered with the address of the translation.
  const [file] = $("file").files;
  $("file-link").hidden = true;
  if (!file) {
    $("file-status").textContent = "choose a file first";
    return;
  }
  const form = new FormData();
  form.append("file", file);
  form.append("source", $("source").value);
  form.append("target", $("target").value);
  if ($("api-key").value) form.append("api_key", $("api-key").value);
  $("file-go").disabled = true;
  $("file-status").textContent = `Translating ${file.name}...`;
  try {
    const r = await fetch("translate_file", { method: "POST", body: form });
    const answer = await r.json().catch(() => null);
    if (!r.ok) {
      $("file-status").textContent = (answer && answer.error) || `the server answered ${r.status}`;
      return;
    }
    // The download relative to this page: the server's own address for it (public_url) may not be the
    // one this browser reached it by (a reverse proxy, TLS, a path prefix).
    const url = answer.translatedFileUrl;
    $("file-link").href = url.slice(url.indexOf("download_file/"));
    $("file-link").download = file.name;
    $("file-link").hidden = false;
    $("file-status").textContent = `${file.name} is translated.`;
  } catch (e) {
    $("file-status").textContent = `the server could not be reached (${e.message})`;
  } finally {
    $("file-go").disabled = false;
  }
}

async function start() {
  const [languages, settings] = await Promise.all([
    fetch("languages").then((r) => r.json()),
    fetch("frontend/settings").then((r) => r.json()),
  ]);
  for (const l of languages) {
    names[l.code] = l.name;
    targets[l.code] = l.targets;
  }
  $("source").append(...languages.filter((l) => l.targets.length).map((l) => option(l.code)));
  fillTargets();
  if (settings.language && settings.language.target) $("target").value = settings.language.target.code;
  charLimit = settings.charLimit;
  $("text").maxLength = charLimit;
  $("key-field").hidden = !settings.keyRequired;
  showCount();
  $("source").addEventListener("change", () => { fillTargets(); later(); });
  $("target").addEventListener("change", later);
  $("html").addEventListener("change", later);
  $("alternatives").addEventListener("change", later);
  $("memory").addEventListener("change", later);
  $("fuzzy").addEventListener("change", later);
  $("api-key").addEventListener("change", memories);
  $("approve").addEventListener("click", approve);
  memories();
  $("text").addEventListener("input", later);
  $("swap").addEventListener("click", swap);
  $("copy").addEventListener("click", async () => {
    await navigator.clipboard.writeText($("translation").value).catch(() => $("translation").select());
    $("copied").textContent = "Copied";
  });
  $("translate-form").addEventListener("submit", (e) => { e.preventDefault(); clearTimeout(timer); translate(); });
  $("file-form").addEventListener("submit", (e) => { e.preventDefault(); translateFile(); });
  $("text").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) { e.preventDefault(); clearTimeout(timer); translate(); }
  });
}

// The about line: each model's licence as its card names it, and a warning where it forbids commercial use.
async function about() {
  const { models } = await fetch("v1/models").then((r) => r.json());
  const byLicence = {};
  for (const m of models) {
    if (!m.license) continue;
    const key = `${m.license}\u0000${m.non_commercial ? 1 : 0}`;
    (byLicence[key] = byLicence[key] || []).push(m.name);
  }
  const parts = Object.entries(byLicence).map(([key, pairs]) => {
    const [licence, nc] = key.split("\u0000");
    return `${pairs.join(", ")}: ${licence}${nc === "1" ? " (not for commercial use)" : ""}`;
  });
  $("licences").textContent = parts.length ? `Model licences: ${parts.join("; ")}.` : "";
  $("licences").classList.toggle("warning", models.some((m) => m.non_commercial));
}

start().catch((e) => { $("error").textContent = `the page could not load the server's languages (${e.message})`; });
about().catch(() => {});  // the page works without its about line
