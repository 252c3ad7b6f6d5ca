/* Knowledge Grounding Console: dependency-free, no build step.
 * Everything the server returns is put into the page as text (textContent / text
 * nodes); the only markup the console creates itself is <mark> around query terms
 * and the [n] citation links.  No innerHTML with server data, ever. */
(function () {
  "use strict";

  var QUERY_URL = "/api/knowledge/query";
  var CONFIG_URL = "/api/knowledge/config";
  var HEALTH_URL = "/health";
  var FEEDBACK_URL = "/api/knowledge/feedback";
  var NOTE_LIMIT = 1000; // the server's default max_note_chars; the server has the final word
  var SAVED = "Thanks \u2014 feedback saved";

  var $ = function (id) { return document.getElementById(id); };
  var form = $("query-form"), q = $("q"), kInput = $("k"), alpha = $("alpha"), alphaOut = $("alpha-value"),
      alphaReset = $("alpha-reset"), reranker = $("reranker"), fusion = $("fusion"), submit = $("submit"), formError = $("form-error"),
      statusEl = $("status"), errorPanel = $("error-panel"), errorMessage = $("error-message"), errorTitle = $("error-title"), retry = $("retry"),
      answerPanel = $("answer-panel"), answerText = $("answer-text"), answerMeta = $("answer-meta"),
      metaLine = $("meta-line"), rerankerNote = $("reranker-note"), missingNote = $("missing-note"), empty = $("empty"), list = $("results"),
      template = $("result-template");

  var alphaTouched = false;
  var serverAlpha = 0.5; // the server's effective default (GET /api/knowledge/config), where "Use server default" puts the slider
  var lastBody = null;   // the last request sent, for Retry
  var current = null;    // the last successful response
  var seq = 0;           // ignore responses of superseded requests

  // ------------------------------------------------------------ query terms (mirrors citations.query_terms)
  var STOPWORDS = new Set(("a about above after again against all also am an and any are as at be because been before being " +
    "below between both but by can could did do does doing don down during each either else few for from further had has " +
    "have having he her here hers herself him himself his how i if in into is it its itself just let me more most my myself " +
    "no nor not of off on once only or other our ours ourselves out over own please s same shall she should so some such t " +
    "than that the their theirs them themselves then there these they this those through to too under until up upon us very " +
    "was we were what when where which while who whom whose why will with within without would you your yours yourself " +
    "yourselves").split(" "));
  var SUFFIXES = [["ingly", 3], ["edly", 3], ["ation", 3], ["ment", 3], ["ness", 3], ["ing", 3], ["ed", 3], ["ly", 4]];
  var UNDOUBLE = { ing: 1, ed: 1, ingly: 1, edly: 1 };

  function normalize(text) {
    return text.toLowerCase().normalize("NFKD").replace(/[\u0300-\u036f]/g, "");
  }

  function stem(word) {
    if (word.length <= 3 || !/^[a-z]+$/.test(word)) return word;
    if (/sses$/.test(word)) word = word.slice(0, -2);
    else if (/ies$/.test(word) && word.length > 4) word = word.slice(0, -3) + "y";
    else if (/(ss|us|is)$/.test(word)) { /* keep */ }
    else if (/s$/.test(word)) word = word.slice(0, -1);
    for (var i = 0; i < SUFFIXES.length; i++) {
      var suffix = SUFFIXES[i][0], minStem = SUFFIXES[i][1];
      if (word.slice(-suffix.length) !== suffix) continue;
      var base = word.slice(0, -suffix.length);
      if (base.length < minStem || !/[aeiouy]/.test(base)) continue;
      if (suffix === "ly" && /pp$/.test(base)) continue;
      word = base;
      var last = word.charAt(word.length - 1);
      if (UNDOUBLE[suffix] && word.length > 3 && last === word.charAt(word.length - 2) && "lszaeiou".indexOf(last) < 0) {
        word = word.slice(0, -1);
      }
      break;
    }
    if (word.length > 3 && /e$/.test(word)) word = word.slice(0, -1);
    if (word.length > 3 && /i$/.test(word)) word = word.slice(0, -1) + "y";
    return word;
  }

  function queryTerms(query) {
    var terms = new Set();
    normalize(query).split(/[^a-z0-9_]+/).forEach(function (token) {
      if (token && !STOPWORDS.has(token)) terms.add(stem(token));
    });
    return terms;
  }

  /** Append `text` to `el` as text nodes, wrapping words whose stem is a query term in <mark>. */
  function appendHighlighted(el, text, terms) {
    var word = /[\p{L}\p{N}_]+/gu, last = 0, m;
    while ((m = word.exec(text)) !== null) {
      var parts = normalize(m[0]).split(/[^a-z0-9_]+/);
      var hit = parts.some(function (p) { return p && !STOPWORDS.has(p) && terms.has(stem(p)); });
      if (!hit) continue;
      if (m.index > last) el.appendChild(document.createTextNode(text.slice(last, m.index)));
      var mark = document.createElement("mark");
      mark.textContent = m[0];
      el.appendChild(mark);
      last = m.index + m[0].length;
    }
    if (last < text.length) el.appendChild(document.createTextNode(text.slice(last)));
  }

  // ------------------------------------------------------------ small helpers
  function show(el, on) { el.hidden = !on; }

  function fmt(value, digits) {
    return typeof value === "number" && isFinite(value) ? value.toFixed(digits === undefined ? 3 : digits) : "\u2014";
  }

  function formatPages(pages) {
    if (!pages || !pages.length) return "";
    var sorted = pages.slice().sort(function (a, b) { return a - b; });
    if (sorted.length === 1) return "p. " + sorted[0];
    var contiguous = sorted.every(function (p, i) { return i === 0 || p === sorted[i - 1] + 1; });
    return "pp. " + (contiguous ? sorted[0] + "\u2013" + sorted[sorted.length - 1] : sorted.join(", "));
  }

  // validity: "valid since 2025-03-01", or "valid 2024-01-02 to 2025-03-01 (superseded)" for an old revision
  function formatValidity(item) {
    var day = function (iso) { return String(iso || "").slice(0, 10); };
    if (item.valid_to) {
      return "valid " + (item.valid_from ? day(item.valid_from) : "?") + " to " + day(item.valid_to) +
        (item.status === "superseded" ? " (superseded)" : "");
    }
    return item.valid_from ? "valid since " + day(item.valid_from) : "";
  }

  function safeHref(url) {
    if (!url) return null;
    try {
      var parsed = new URL(url, window.location.href);
      return parsed.protocol === "http:" || parsed.protocol === "https:" ? parsed.href : null;
    } catch (e) {
      return null;
    }
  }

  /** The human message of an error response: {message} (our handlers) or {detail} (HTTPException). */
  function messageOf(body, status) {
    if (body && typeof body.message === "string" && body.message) return body.message;
    if (body && typeof body.detail === "string") return body.detail;
    if (body && Array.isArray(body.detail)) return body.detail.map(function (d) { return d.msg || String(d); }).join("; ");
    return "The server answered with HTTP " + status + ".";
  }

  // ------------------------------------------------------------ admin token (a server run for others)
  // A server in remote mode (or with GROUNDWORK_ADMIN_TOKEN set) answers its admin routes only with the admin
  // token.  The console asks for it once, when an admin page is refused (401), keeps it in sessionStorage (gone
  // when the tab closes) and sends it as an Authorization header: never in a URL.
  var TOKEN_KEY = "groundwork.adminToken";
  var tokenAsked = null;  // the open question, shared by requests refused at the same time

  function storedToken() {
    try { return sessionStorage.getItem(TOKEN_KEY) || ""; } catch (e) { return ""; }
  }

  function storeToken(value) {
    try {
      if (value) sessionStorage.setItem(TOKEN_KEY, value); else sessionStorage.removeItem(TOKEN_KEY);
    } catch (e) { /* storage off: the token lasts until the page is left */ }
  }

  /** ``init`` with ``token`` as an Authorization header (when there is one). */
  function withToken(init, token) {
    var copy = {}, headers = {}, key;
    init = init || {};
    for (key in init) if (Object.prototype.hasOwnProperty.call(init, key)) copy[key] = init[key];
    for (key in (init.headers || {})) if (Object.prototype.hasOwnProperty.call(init.headers, key)) headers[key] = init.headers[key];
    if (token) headers["Authorization"] = "Bearer " + token;
    copy.headers = headers;
    return copy;
  }

  /** Ask for the admin token (a modal dialog); resolves the token given, or "" when cancelled. */
  function askToken(rejected) {
    if (tokenAsked) return tokenAsked;
    var dialog = $("token-dialog"), input = $("token-input");
    $("token-text").textContent = rejected
      ? "That token was not accepted. Enter the server's admin token again."
      : "This page changes or reads the server's administration data, and the server asks for its admin token " +
        "(GROUNDWORK_ADMIN_TOKEN, or the admin_token file in its data folder).";
    input.value = "";
    tokenAsked = new Promise(function (resolve) {
      function closed() {
        dialog.removeEventListener("close", closed);
        tokenAsked = null;
        var value = dialog.returnValue === "ok" ? input.value.trim() : "";
        input.value = "";
        if (value) storeToken(value);
        resolve(value);
      }
      dialog.addEventListener("close", closed);
      dialog.returnValue = "";
      dialog.showModal();
      input.focus();
    });
    return tokenAsked;
  }

  /** fetch with the admin token.  A 401 on an admin request (``prompt``) asks for the token and tries again;
   * elsewhere (search, feedback: public routes) a refused token is dropped and the request goes out without it.
   * What a 401 refused is the token this request *sent*: one stored while it was on its way (the dialog of
   * another request, another script of this tab) is tried, never dropped or asked for again. */
  function authFetch(url, init, prompt) {
    var sent = storedToken();
    return fetch(url, withToken(init, sent)).then(function (response) {
      if (response.status !== 401) return response;
      var now = storedToken();
      if (now && now !== sent) return authFetch(url, init, prompt);  // a newer token arrived meanwhile
      if (!prompt) {
        if (!sent) return response;
        storeToken("");
        return fetch(url, withToken(init, ""));
      }
      return askToken(!!sent).then(function (token) {
        return token ? authFetch(url, init, prompt) : response;
      });
    });
  }

  // shared with admin.js (loaded after this file by index.html), so both pages link, word errors and send the
  // admin token alike
  window.GroundworkConsole = { safeHref: safeHref, messageOf: messageOf, authFetch: authFetch, askToken: askToken,
                               storedToken: storedToken };

  function postJSON(url, payload) {
    return authFetch(url, {
      method: "POST",
      headers: { "Content-Type": "application/json", "Accept": "application/json" },
      body: JSON.stringify(payload)
    }, false).then(function (response) {
      return response.text().then(function (raw) {
        var body = null;
        try { body = raw ? JSON.parse(raw) : null; } catch (e) { body = null; }
        return { ok: response.ok, status: response.status, body: body, retryAfter: response.headers.get("Retry-After") };
      });
    });
  }

  // ------------------------------------------------------------ form
  function setAlphaTouched(on) {
    alphaTouched = on;
    alphaOut.textContent = on ? Number(alpha.value).toFixed(2) : "server default";
    alphaOut.classList.toggle("set", on);
    show(alphaReset, on);
  }
  alpha.addEventListener("input", function () { setAlphaTouched(true); });
  alphaReset.addEventListener("click", function () {
    alpha.value = String(serverAlpha);
    setAlphaTouched(false);
    alpha.focus();
  });

  function clearFormError() {
    formError.textContent = "";
    show(formError, false);
    [q, kInput, alpha, reranker, fusion].forEach(function (el) { el.removeAttribute("aria-invalid"); });
  }

  function showFormError(message, fields) {
    formError.textContent = message;
    show(formError, true);
    var byField = { query: q, k: kInput, alpha: alpha, reranker: reranker, fusion: fusion };
    (fields || []).forEach(function (f) {
      var el = byField[String(f).split(".")[0]];
      if (el) el.setAttribute("aria-invalid", "true");
    });
  }

  form.addEventListener("submit", function (event) {
    event.preventDefault();
    clearFormError();
    var k = Number(kInput.value);
    if (!Number.isInteger(k) || k < 1 || k > 20) {
      showFormError("Results (k) must be a whole number from 1 to 20.", ["k"]);
      kInput.focus();
      return;
    }
    var body = { query: q.value, k: k, answer: "extractive" };
    if (reranker.value) body.reranker = reranker.value;  // "" until the config loads: the server's default
    if (alphaTouched) body.alpha = Number(alpha.value);
    if (fusion.value) body.fusion = fusion.value;
    if (entityFilters.length) body.filters = { entities: entityFilters.slice() };
    runQuery(body);
  });

  // ------------------------------------------------------------ entity filters (filters.entities)
  // an entity chip on a result adds its value here; the search runs again, restricted to passages mentioning it
  var entityFilters = [];
  var entityFilterBox = $("entity-filters"), entityFilterList = $("entity-filter-list");

  function searchAgain() {
    if (!q.value.trim()) return;
    if (typeof form.requestSubmit === "function") form.requestSubmit();
    else form.dispatchEvent(new Event("submit", { cancelable: true }));
  }

  function renderEntityFilters() {
    entityFilterList.textContent = "";
    entityFilters.forEach(function (value) {
      var li = document.createElement("li"), button = document.createElement("button");
      button.type = "button";
      button.className = "chip chip-remove";
      button.textContent = value + " \u00d7";
      button.setAttribute("aria-label", "Remove the filter " + value);
      button.addEventListener("click", function () {
        entityFilters = entityFilters.filter(function (v) { return v !== value; });
        renderEntityFilters();
        q.focus();
        searchAgain();
      });
      li.appendChild(button);
      entityFilterList.appendChild(li);
    });
    show(entityFilterBox, entityFilters.length > 0);
  }

  function addEntityFilter(value) {
    if (entityFilters.indexOf(value) < 0) entityFilters.push(value);
    renderEntityFilters();
    var buttons = entityFilterList.querySelectorAll("button");
    if (buttons.length) buttons[buttons.length - 1].focus();  // the clicked chip is re-rendered away
    searchAgain();
  }

  function renderEntityChips(node, item) {
    var chips = node.querySelector(".entity-chips");
    (item.entities || []).forEach(function (entity) {
      var li = document.createElement("li"), button = document.createElement("button");
      button.type = "button";
      button.className = "chip";
      button.textContent = entity.value;
      button.title = entity.type + ": search only passages mentioning " + entity.value;
      button.setAttribute("aria-label", "Filter by " + entity.type + " " + entity.value);
      button.setAttribute("aria-pressed", entityFilters.indexOf(entity.value) >= 0 ? "true" : "false");
      button.addEventListener("click", function () { addEntityFilter(entity.value); });
      li.appendChild(button);
      chips.appendChild(li);
    });
    show(chips, (item.entities || []).length > 0);
  }

  retry.addEventListener("click", function () {
    if (lastBody) runQuery(lastBody);
  });

  // ------------------------------------------------------------ query
  function setBusy(on) {
    submit.disabled = on;
    retry.disabled = on;
    list.setAttribute("aria-busy", on ? "true" : "false");
  }

  function runQuery(body) {
    lastBody = body;
    var mine = ++seq;
    setBusy(true);
    statusEl.textContent = "Searching\u2026";
    postJSON(QUERY_URL, body).then(function (res) {
      if (mine !== seq) return;
      if (res.ok) {
        show(errorPanel, false);
        render(res.body, body);
      } else if (res.status === 422) {
        show(errorPanel, false);
        var errors = (res.body && res.body.errors) || [];
        showFormError(messageOf(res.body, res.status), errors.map(function (e) { return e.field; }));
        statusEl.textContent = "Please correct the search.";
      } else if (res.status === 503 && res.body && res.body.error === "model_loading") {
        // the server is up, its model is not yet: this search runs by itself once it is
        show(errorPanel, false);
        waitingBody = body;
        var wait = Number(res.retryAfter) || res.body.retry_after_s;
        showModelLoading(wait, null);
        statusEl.textContent = "The model is still loading \u2014 your search will run as soon as it is ready" +
          (wait > 0 ? " (in about " + Math.ceil(wait) + " s)." : ".");
        scheduleModelCheck(wait);
      } else if (res.status === 503 && res.body && res.body.error === "model_load_failed") {
        showModelError(messageOf(res.body, res.status));
        serverDown(messageOf(res.body, res.status), "The model could not be loaded");
      } else if (res.status >= 500) {
        serverDown(messageOf(res.body, res.status), "The server could not answer (HTTP " + res.status + ")");
      } else {
        showFormError(messageOf(res.body, res.status));
        statusEl.textContent = "The search failed.";
      }
    }, function () {
      if (mine !== seq) return;
      serverDown("The server could not be reached. Check that \u201cgroundwork serve\u201d is running, then retry.",
                 "Cannot reach the server");
    }).then(function () {
      if (mine === seq) setBusy(false);
    });
  }

  // ------------------------------------------------------------ the model loading (GET /health)
  // The server answers from the moment it starts, while its embedding model may still be loading (the first time
  // on a data folder it is exported and quantised: a minute or two); searches answer 503 model_loading with
  // Retry-After until it is ready.  The notice says so and when, the search box explains, /health is polled until
  // the model is up, and a search that came in meanwhile runs then.
  var modelNotice = $("model-notice"), queryHint = $("query-hint");
  var QUERY_HINT = queryHint.textContent;
  var PHASES = { starting: "starting", waiting: "waiting for another process that is building it",
                 exporting: "exporting it to ONNX, once per model",
                 quantising: "quantising it, once per model",
                 checking: "checking the quantised graph against fp32 on this CPU, once per CPU", loading: "loading it" };
  var modelState = "unknown", modelPoll = null, waitingBody = null, readyTimer = null;

  function showModelLoading(seconds, phase) {
    modelState = "loading";
    if (readyTimer) { clearTimeout(readyTimer); readyTimer = null; }
    var about = seconds > 0 ? "about " + Math.ceil(seconds) + " s" : "a moment";
    modelNotice.textContent = "Model loading \u2014 answers available in " + about +
      (PHASES[phase] ? " (" + PHASES[phase] + ")" : "") + ".";
    modelNotice.className = "model-notice";
    show(modelNotice, true);
    queryHint.textContent = "The model is still loading: a search started now runs as soon as it is ready.";
  }

  function showModelError(reason) {
    modelState = "error";
    waitingBody = null;
    modelNotice.textContent = "The model could not be loaded, so searches cannot be answered" +
      (reason ? ": " + reason : ".");
    modelNotice.className = "model-notice error";
    show(modelNotice, true);
    queryHint.textContent = "Searches are refused until the server's model loads (see Health).";
  }

  function modelReady() {
    var was = modelState;
    modelState = "up";
    queryHint.textContent = QUERY_HINT;
    if (was === "loading") {  // said once, then the notice goes
      modelNotice.textContent = "The model is ready.";
      modelNotice.className = "model-notice ready";
      readyTimer = setTimeout(function () { show(modelNotice, false); readyTimer = null; }, 4000);
    } else if (was !== "up") {
      show(modelNotice, false);
    }
    if (waitingBody) {
      var body = waitingBody;
      waitingBody = null;
      runQuery(body);
    }
  }

  function scheduleModelCheck(seconds) {
    if (modelPoll) clearTimeout(modelPoll);
    // at least every 5 s (the estimate may be long), every 2 s while a search waits to run: /health is cheap and
    // the user is watching
    var wait = Math.min(waitingBody ? 2 : 5, Math.max(1, Number(seconds) || 2));
    modelPoll = setTimeout(checkModel, wait * 1000);
  }

  function checkModel() {
    modelPoll = null;
    fetch(HEALTH_URL, { headers: { "Accept": "application/json" } }).then(function (response) {
      return response.json();
    }).then(function (health) {
      var model = health && health.services ? health.services.model : null;
      var load = (health && health.model_load) || {};
      if (model === "loading" || model === "not_loaded") {
        showModelLoading(load.retry_after_s, load.phase);
        scheduleModelCheck(load.retry_after_s);
      } else if (model === "error") {
        showModelError((health.reasons || {}).model || load.error || "");
      } else {  // up, or a /health that does not say: a search says for itself (503 model_loading)
        modelReady();
      }
    }, function () {
      if (modelState === "loading" || waitingBody) scheduleModelCheck(5);  // not reachable now: look again
    });
  }

  function serverDown(message, title) {
    errorTitle.textContent = title;
    errorMessage.textContent = message;
    show(errorPanel, true);
    statusEl.textContent = "Search failed.";
  }

  // ------------------------------------------------------------ rendering
  function render(data, body) {
    current = data;
    var results = data.results || [];
    var latency = data.latency_ms || {};
    var terms = queryTerms(body.query);

    list.textContent = "";
    show(empty, results.length === 0);

    // answer, coverage, latency, reranker status
    answerText.textContent = "";
    var answer = data.answer;
    if (results.length && answer && answer.text) renderAnswer(answer.text, results);
    show(answerText, !!(results.length && answer && answer.text));
    // words of the question that no document contains: whatever the scores, the passages cannot answer about them
    var missing = data.missing_terms || [];
    missingNote.textContent = missing.length
      ? "No document mentions " + missing.map(function (w) { return "\u201c" + w + "\u201d"; }).join(", ") +
        ": the passages cannot answer about " + (missing.length === 1 ? "it." : "them.")
      : "";
    show(missingNote, missing.length > 0);
    answerMeta.textContent = "";
    var badge = document.createElement("span");
    badge.className = "badge cov-" + (data.coverage || "none");
    badge.textContent = "Coverage: " + (data.coverage || "none");
    answerMeta.appendChild(badge);
    if (answer && answer.method) answerMeta.appendChild(document.createTextNode(" \u00b7 " + answer.method + " answer"));
    if (answer && typeof answer.confidence === "number") {
      // how well the quoted sentences answer the question (0-1): what caps the coverage
      answerMeta.appendChild(document.createTextNode(" \u00b7 confidence " + fmt(answer.confidence, 2)));
    }

    var parts = ["embed", "bm25", "vector", "fuse", "rerank", "format"].filter(function (key) {
      return typeof latency[key] === "number";
    }).map(function (key) { return (key === "bm25" ? "BM25" : key) + " " + fmt(latency[key], 1); });
    // the alpha this query ran with, and why when it is not the corpus default's (a question, an entity named)
    var ran = data.params || {};
    var form = { question: " (a question)", named_entity: " (names an entity)" }[ran.query_form] || "";
    metaLine.textContent = "Latency " + fmt(latency.total, 0) + " ms" + (parts.length ? " (" + parts.join(" \u00b7 ") + " ms)" : "") +
      (typeof ran.alpha === "number" ? " \u00b7 alpha " + fmt(ran.alpha, 2) + form : "") +
      (data.snapshot_version !== undefined && data.snapshot_version !== null ? " \u00b7 index snapshot v" + data.snapshot_version : "");

    var rs = String(data.reranker_status || "");
    rerankerNote.textContent = rs.indexOf("fallback") === 0
      ? "Reranker " + (body.reranker || (data.params && data.params.reranker) || "") + " was not applied (" + rs + "); results are in fused order."
      : "";
    show(rerankerNote, rs.indexOf("fallback") === 0);
    show(answerPanel, true);

    results.forEach(function (item) { list.appendChild(renderResult(item, terms, data.retrieval_request_id)); });

    statusEl.textContent = results.length
      ? results.length + (results.length === 1 ? " result" : " results") + " in " + fmt(latency.total, 0) + " ms."
      : "No relevant content found (" + fmt(latency.total, 0) + " ms).";
  }

  function renderAnswer(text, results) {
    var known = new Set(results.map(function (r) { return r.n; }));
    var marker = /\[(\d+)\]/g, last = 0, m;
    while ((m = marker.exec(text)) !== null) {
      var n = Number(m[1]);
      if (!known.has(n)) continue;
      if (m.index > last) answerText.appendChild(document.createTextNode(text.slice(last, m.index)));
      var a = document.createElement("a");
      a.className = "cite";
      a.href = "#result-" + n;
      a.textContent = "[" + n + "]";
      a.setAttribute("aria-label", "source " + n);
      answerText.appendChild(a);
      last = m.index + m[0].length;
    }
    if (last < text.length) answerText.appendChild(document.createTextNode(text.slice(last)));
  }

  function renderResult(item, terms, requestId) {
    var node = template.content.firstElementChild.cloneNode(true);
    var n = item.n, title = item.title || item.doc_id || "Untitled";
    node.id = "result-" + n;
    node.dataset.chunkId = item.chunk_id;
    node.querySelector(".result-n").textContent = "[" + n + "]";
    node.querySelector(".title-text").textContent = title;

    var where = [];
    var section = item.section || "";
    if (section.indexOf(title + " > ") === 0) section = section.slice(title.length + 3);  // the path repeats the title
    if (section && section !== title) where.push(section);
    var pages = formatPages(item.pages);
    if (pages) where.push(pages);
    if (item.version) where.push("version " + item.version);
    if (item.rev_label) where.push(item.rev_label);
    var validity = formatValidity(item);
    if (validity) where.push(validity);
    if (item.ocr) {
      where.push(typeof item.ocr_confidence === "number"
        ? "OCR text, " + Math.round(item.ocr_confidence * 100) + "% word confidence"
        : "OCR text");
    }
    node.querySelector(".result-where").textContent = where.join(" \u00b7 ");
    renderEntityChips(node, item);

    appendHighlighted(node.querySelector(".snippet"), item.snippet || "", terms);

    var scores = node.querySelector(".scores");
    [["Fused", item.score], ["BM25", item.bm25_score], ["Vector", item.vector_score], ["Relevance", item.relevance]]
      .concat(item.rerank_score !== null && item.rerank_score !== undefined ? [["Rerank", item.rerank_score]] : [])
      .forEach(function (pair) {
        var div = document.createElement("div"), dt = document.createElement("dt"), dd = document.createElement("dd");
        dt.textContent = pair[0];
        dd.textContent = fmt(pair[1]);
        div.appendChild(dt);
        div.appendChild(dd);
        scores.appendChild(div);
      });

    var link = node.querySelector(".source-link");
    var href = safeHref(item.source_url || item.url);
    if (href) {
      link.href = href;
      link.setAttribute("aria-label", "View source: " + title + (pages ? ", " + pages : "") + " (opens in a new tab)");
    } else {
      link.remove();
    }

    wireFeedback(node, item, title, requestId);
    return node;
  }

  // ------------------------------------------------------------ feedback
  function wireFeedback(node, item, title, requestId) {
    var group = node.querySelector(".feedback");
    var up = node.querySelector(".thumb-up"), down = node.querySelector(".thumb-down");
    var status = node.querySelector(".feedback-status");
    var noteForm = node.querySelector(".note-form"), noteText = node.querySelector(".note-text");
    var noteLabel = node.querySelector(".note-label"), noteCount = node.querySelector(".note-count");
    var noteId = "note-" + item.n;
    var rating = null;

    group.setAttribute("aria-label", "Feedback on result " + item.n);
    up.setAttribute("aria-label", "Helpful: " + title);
    down.setAttribute("aria-label", "Not helpful: " + title);
    noteText.id = noteId;
    noteLabel.setAttribute("for", noteId);
    noteLabel.textContent = "Note on result " + item.n + " (optional)";

    function say(text, kind) {
      status.textContent = text;
      status.className = "feedback-status" + (kind ? " " + kind : "");
    }

    function send(newRating, note) {
      var payload = { retrieval_request_id: requestId, chunk_id: item.chunk_id, rating: newRating };
      if (note !== undefined) payload.note = note;
      var buttons = group.querySelectorAll("button");
      buttons.forEach(function (b) { b.disabled = true; });
      say("Saving\u2026");
      return postJSON(FEEDBACK_URL, payload).then(function (res) {
        if (res.ok) {
          rating = newRating;
          up.setAttribute("aria-pressed", String(rating === "up"));
          down.setAttribute("aria-pressed", String(rating === "down"));
          say(SAVED, "ok");
          return true;
        }
        say("Feedback not saved: " + messageOf(res.body, res.status), "error");
        return false;
      }, function () {
        say("Feedback not saved: the server could not be reached.", "error");
        return false;
      }).then(function (ok) {
        buttons.forEach(function (b) { b.disabled = false; });
        return ok;
      });
    }

    up.addEventListener("click", function () {
      if (rating === "up") { say("Already marked helpful.", "ok"); return; }
      send("up");
    });
    down.addEventListener("click", function () {
      if (rating === "down") { say("Already marked not helpful.", "ok"); return; }
      send("down");
    });

    noteText.addEventListener("input", function () {
      var n = noteText.value.length;
      noteCount.textContent = n + "/" + NOTE_LIMIT;
      noteCount.classList.toggle("over", n > NOTE_LIMIT);
    });
    noteForm.addEventListener("submit", function (event) {
      event.preventDefault();
      if (!rating) {
        say("Choose Helpful or Not helpful first; the note is saved with it.", "error");
        up.focus();
        return;
      }
      var note = noteText.value.trim();
      if (!note) { say("Write a note first.", "error"); noteText.focus(); return; }
      send(rating, note);
    });
  }

  setAlphaTouched(false);

  // ------------------------------------------------------------ server defaults and the self-tuned ranking
  var rankingDefaults = $("ranking-defaults"), tuningPanel = $("tuning-panel"), tuningSummary = $("tuning-summary"),
      tuningBody = $("tuning-body"), tuningMeta = $("tuning-meta");
  var adapterPanel = $("adapter-panel"), adapterSummary = $("adapter-summary");
  var SOURCE_WORDS = { tuned: "self-tuned", setting: "server setting", console: "set in Settings", "default": "built-in" };

  function weight(value) {
    return typeof value === "number" && isFinite(value) ? String(Number(value.toFixed(2))) : "\u2014";
  }

  /** "weighted fusion, alpha 0.50, section weight 0.5, lead weight 0.3 (self-tuned)"; per value when the sources differ. */
  function rankingText(config) {
    var sources = config.ranking_sources || {};
    var parts = [
      ["fusion", config.default_fusion + " fusion"], ["alpha", "alpha " + fmt(config.default_alpha, 2)],
      ["section_weight", "section weight " + weight(config.section_weight)], ["lead_weight", "lead weight " + weight(config.lead_weight)]
    ];
    // questions ("How do I ...?") get their own alpha unless it is off or a pinned alpha applies to them too
    if (typeof config.question_alpha === "number") parts.splice(2, 0, ["question_alpha", "questions alpha " + fmt(config.question_alpha, 2)]);
    var kinds = parts.map(function (p) { return sources[p[0]] || "default"; });
    var same = kinds.every(function (k) { return k === kinds[0]; });
    var text = parts.map(function (p, i) {
      return p[1] + (same ? "" : " (" + (SOURCE_WORDS[kinds[i]] || kinds[i]) + ")");
    }).join(", ");
    return "Server ranking defaults: " + text + (same ? " (" + (SOURCE_WORDS[kinds[0]] || kinds[0]) + ")" : "") + ".";
  }

  var rerankerTouched = false;
  reranker.addEventListener("change", function () { rerankerTouched = true; });

  /** Offer only the rerankers the server can run (config.rerankers, labelled by config.reranker_labels): the
   *  server's registry is the one list; until it answers the only choice is "server default". */
  function fillRerankers(config) {
    var offered = Array.isArray(config.rerankers) ? config.rerankers.map(String) : null;
    if (!offered || !offered.length) return;  // keep "server default"
    var labels = config.reranker_labels || {};
    var chosen = reranker.value;
    reranker.textContent = "";
    offered.forEach(function (name) {
      var option = document.createElement("option");
      option.value = name;
      option.textContent = labels[name] || name;
      reranker.appendChild(option);
    });
    var preferred = rerankerTouched ? chosen : String(config.default_reranker || chosen);
    reranker.value = offered.indexOf(preferred) >= 0 ? preferred : (offered.indexOf(chosen) >= 0 ? chosen : offered[0]);
  }

  function fillFusion(config) {
    var modes = config.fusion_modes || {};
    var chosen = fusion.value;
    fusion.textContent = "";
    var first = document.createElement("option");
    first.value = "";
    first.textContent = "server default (" + config.default_fusion + ")";
    fusion.appendChild(first);
    Object.keys(modes).forEach(function (mode) {
      var option = document.createElement("option");
      option.value = mode;
      option.textContent = mode;
      option.title = String(modes[mode]);
      fusion.appendChild(option);
    });
    if (chosen && Object.prototype.hasOwnProperty.call(modes, chosen)) fusion.value = chosen;
  }

  function tuningRow(label, scores, cls) {
    var params = (scores && scores.params) || {};
    var row = document.createElement("tr");
    if (cls) row.className = cls;
    var head = document.createElement("th");
    head.scope = "row";
    head.textContent = label;
    row.appendChild(head);
    cell(row, String(params.fusion || "\u2014"));
    cell(row, fmt(params.alpha, 2), "num");
    cell(row, weight(params.section_weight), "num");
    cell(row, weight(params.lead_weight), "num");
    cell(row, fmt(scores && scores["ndcg@10"]), "num");
    cell(row, fmt(scores && scores["recall@5"]), "num");
    return row;
  }

  function renderTuning(tuned) {
    show(tuningPanel, !!tuned);
    if (!tuned) return;
    var before = tuned.before || {}, after = tuned.after || {}, params = after.params || {};
    tuningSummary.textContent = "nDCG@10 " + fmt(before["ndcg@10"]) + " \u2192 " + fmt(after["ndcg@10"]) + " \u00b7 " +
      params.fusion + ", alpha " + fmt(params.alpha, 2) + ", section " + weight(params.section_weight) + ", lead " +
      weight(params.lead_weight) + (tuned.in_use === false ? " \u00b7 not in use" : "");
    tuningBody.textContent = "";
    tuningBody.appendChild(tuningRow("Built-in", before));
    tuningBody.appendChild(tuningRow("Self-tuned", after, "chosen"));
    var counts = tuned.pseudo_queries || {};
    var total = Object.keys(counts).reduce(function (sum, kind) { return sum + (counts[kind] || 0); }, 0);
    var kinds = Object.keys(counts).map(function (kind) { return counts[kind] + " " + kind; }).join(", ");
    tuningMeta.textContent = "Measured on " + total + " pseudo-queries from the corpus itself (" + kinds + ") of index snapshot v" +
      tuned.snapshot_version + ", " + String(tuned.created_at || "").replace("T", " ").slice(0, 16) + ", in " +
      fmt(tuned.seconds, 1) + " s." + (tuned.in_use === false
        ? " Not in use: GROUNDWORK_USE_TUNED_RANKING is false."
        : " Used for every search that does not set these values; explicit server settings win.") +
      (tuned.decision && tuned.decision.reason ? " Decision: " + tuned.decision.reason + "." : "");
  }

  /** The stored query adapter's held-out evidence (GET /api/knowledge/config: query_adapter); hidden when none. */
  function renderAdapter(adapter) {
    show(adapterPanel, !!adapter);
    if (!adapter) return;
    if (adapter.error) {
      adapterSummary.textContent = "Not in use: " + adapter.error;
      return;
    }
    var without = adapter.held_out_without || {}, withIt = adapter.held_out_with || {};
    // adapters trained since 2026-11-26 hold out every rated query once (cross-validation) and record the paired gain
    var heldOut = adapter.folds ? adapter.rated_queries + " rated queries, each held out once (" + adapter.folds + "-fold)"
      : adapter.held_out_queries + " held-out of " + adapter.rated_queries + " rated queries";
    var decision = adapter.decision && typeof adapter.decision.gain === "number"
      ? " (paired gain " + fmt(adapter.decision.gain) + " \u00b1 " + fmt(adapter.decision.standard_error) + ")" : "";
    adapterSummary.textContent = "On " + heldOut + ": nDCG@10 " + fmt(without["ndcg@10"]) + " \u2192 " +
      fmt(withIt["ndcg@10"]) + decision + ", Recall@5 " +
      fmt(without["recall@5"]) + " \u2192 " + fmt(withIt["recall@5"]) + " \u00b7 trained " +
      String(adapter.trained_at || "").replace("T", " ").slice(0, 16) + " in " + fmt(adapter.seconds, 1) + " s" +
      (adapter.in_use === false ? " \u00b7 not in use: GROUNDWORK_USE_QUERY_ADAPTER is false" : " \u00b7 in use for every search");
  }

  function loadConfig() {
    // an admin route: with the token when the console has one; without it the search page still works
    return authFetch(CONFIG_URL, { headers: { "Accept": "application/json" } }, false).then(function (response) {
      if (!response.ok) throw new Error("HTTP " + response.status);
      return response.json();
    }).then(function (config) {
      if (typeof config.default_alpha === "number") {
        serverAlpha = config.default_alpha;
        if (!alphaTouched) alpha.value = String(serverAlpha);
      }
      fillFusion(config);
      fillRerankers(config);
      rankingDefaults.textContent = rankingText(config);
      renderTuning(config.tuned);
      renderAdapter(config.query_adapter);
    }).catch(function () {
      rankingDefaults.textContent = "";  // searches still work with the server's defaults
    });
  }

  loadConfig();
  checkModel();

  // the Sources, Upload, Failures, Settings and Evaluation pages live in admin.js
  function cell(row, text, cls) {
    var td = document.createElement("td");
    td.textContent = text;
    if (cls) td.className = cls;
    row.appendChild(td);
    return td;
  }

  // a ranking saved on the Settings page changes the server defaults shown here
  window.addEventListener("groundwork:ranking-changed", function () { loadConfig(); });
})();
