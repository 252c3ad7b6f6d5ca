/* Knowledge Grounding Console: navigation and the administration pages (Sources, one source, Upload,
 * Failures, Settings, Evaluation).  Plain JavaScript, no build step, no dependencies.
 *
 * Pages are hash routes ("#/sources", "#/sources/<name>", ...) of this one document: a route change shows
 * its view, marks the navigation link aria-current, sets the title and moves focus to the view's heading.
 * Other hashes ("#result-2", the answer's citation links) are in-page anchors and leave the view alone.
 * Everything the server sends is put into the page as text (textContent, text nodes, SVG text); URLs are
 * linked only when they are http(s).  No innerHTML with server data, ever. */
(function () {
  "use strict";

  var $ = function (id) { return document.getElementById(id); };
  var POLL_MS = 700;

  // ------------------------------------------------------------ helpers
  function show(node, on) { node.hidden = !on; }

  function el(tag, text, cls) {
    var node = document.createElement(tag);
    if (text !== undefined && text !== null) node.textContent = String(text);
    if (cls) node.className = cls;
    return node;
  }

  function fmt(value, digits) {
    return typeof value === "number" && isFinite(value) ? value.toFixed(digits === undefined ? 3 : digits) : "\u2014";
  }

  function percent(value) {
    return typeof value === "number" && isFinite(value) ? Math.round(value * 100) + "%" : "\u2014";
  }

  function signed(value, digits) {
    if (typeof value !== "number" || !isFinite(value)) return "\u2014";
    var text = Math.abs(value).toFixed(digits === undefined ? 3 : digits);
    return (value > 0 ? "+" : value < 0 ? "\u2212" : "\u00b1") + text;
  }

  /** "2026-01-31 12:00 UTC" from an ISO-8601 time (server times are UTC). */
  function when(iso) {
    if (!iso) return "\u2014";
    var text = String(iso).replace("T", " ").replace(/Z$/, "").replace(/\+00:00$/, "");
    return text.slice(0, 16) + " UTC";
  }

  function bytes(n) {
    if (typeof n !== "number") return "";
    if (n < 1024) return n + " B";
    if (n < 1048576) return (n / 1024).toFixed(1) + " KB";
    return (n / 1048576).toFixed(1) + " MB";
  }

  // http(s) links only, the human message of an error body and requests with the admin token: the search
  // page's (console.js, loaded first)
  var shared = window.GroundworkConsole, safeHref = shared.safeHref, messageOf = shared.messageOf;

  /** fetch + JSON with the admin token (asked for once when the server wants it): resolves {ok, status, body};
   * rejects only when the server cannot be reached. */
  function requestJSON(method, url, payload) {
    var init = { method: method, headers: { "Accept": "application/json" } };
    if (payload !== undefined) {
      init.headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(payload);
    }
    return shared.authFetch(url, init, true).then(function (response) {
      return response.text().then(function (raw) {
        var body = null;
        try { body = raw ? JSON.parse(raw) : null; } catch (e) { body = null; }
        return { ok: response.ok, status: response.status, body: body };
      });
    });
  }

  function getJSON(url) {
    return requestJSON("GET", url).then(function (res) {
      if (!res.ok) throw new Error(messageOf(res.body, res.status));
      return res.body;
    }, function () {
      throw new Error("the server could not be reached");
    });
  }

  function say(node, text, kind) {
    node.textContent = text;
    node.classList.toggle("ok", kind === "ok");
    node.classList.toggle("error", kind === "error");
  }

  function fact(list, term, value) {
    var dt = el("dt", term), dd = el("dd");
    if (value instanceof Node) dd.appendChild(value); else dd.textContent = value === undefined || value === null || value === "" ? "\u2014" : String(value);
    list.appendChild(dt);
    list.appendChild(dd);
  }

  function cell(row, text, cls) {
    var td = el("td", text, cls);
    row.appendChild(td);
    return td;
  }

  /** "not_modified" -> "Not modified" (keys of the server's figures as a label). */
  function words(key) {
    var text = String(key).replace(/_/g, " ");
    return text.charAt(0).toUpperCase() + text.slice(1);
  }

  /** What an ingestion job is doing: a web source's crawl figures and the current stage's counts. */
  function jobProgressText(job) {
    var p = job.progress || {}, parts = [];
    if (p.fetched !== undefined) {
      parts.push("fetched " + p.fetched + ", unchanged " + (p.not_modified || 0) + ", queued " +
                 (p.queued === undefined ? "\u2013" : p.queued) + ", excluded " + (p.excluded || 0) + ", failed " + (p.failed || 0));
    }
    var stage = p.stage && p.stages ? p.stages[p.stage] : null;
    if (stage) {
      parts.push(p.stage + " " + stage.done + (stage.total !== null && stage.total !== undefined ? "/" + stage.total : "") +
                 " " + (stage.unit || "") + (stage.percent !== null && stage.percent !== undefined ? " (" + stage.percent + "%)" : ""));
    }
    return parts.join("; ");
  }

  function stagePercent(job) {
    var p = job.progress || {};
    var stage = p.stage && p.stages ? p.stages[p.stage] : null;
    return stage && typeof stage.percent === "number" ? stage.percent : null;
  }

  /** Poll GET /api/knowledge/jobs/{id} until it succeeds or fails; ``onUpdate(job)`` sees every state. */
  function watchJob(jobId, onUpdate) {
    return new Promise(function (resolve, reject) {
      function poll() {
        getJSON("/api/knowledge/jobs/" + encodeURIComponent(jobId)).then(function (job) {
          if (onUpdate) onUpdate(job);
          if (job.status === "succeeded" || job.status === "failed") resolve(job);
          else setTimeout(poll, POLL_MS);
        }, reject);
      }
      poll();
    });
  }

  // ------------------------------------------------------------ confirmation dialog
  var dialog = $("confirm-dialog");

  /** A modal confirmation (native <dialog>: focus stays inside, Escape cancels); resolves true on OK. */
  function confirmAction(title, text, okLabel) {
    $("confirm-title").textContent = title;
    $("confirm-text").textContent = text;
    $("confirm-ok").textContent = okLabel;
    var opener = document.activeElement;
    return new Promise(function (resolve) {
      dialog.addEventListener("close", function onClose() {
        dialog.removeEventListener("close", onClose);
        if (opener && opener.focus && document.contains(opener)) opener.focus();
        resolve(dialog.returnValue === "ok");
      });
      dialog.returnValue = "";
      dialog.showModal();
      $("confirm-cancel").focus();
    });
  }

  // ------------------------------------------------------------ navigation
  var TITLES = { search: "Search", sources: "Sources", source: "Source", upload: "Upload", failures: "Failures",
                 settings: "Settings", evaluation: "Evaluation" };
  var NAV_OF = { source: "sources" };
  var views = Array.prototype.slice.call(document.querySelectorAll("main .view"));
  var navLinks = Array.prototype.slice.call(document.querySelectorAll(".console-nav a[data-route]"));
  var loaders = {};
  var currentView = "search";

  function parseRoute(hash) {
    if (!/^#\//.test(hash)) return null;
    var parts = hash.slice(2).split("/");
    if (parts[0] === "sources" && parts.length > 1 && parts[1]) {
      return { view: "source", name: decodeURIComponent(parts.slice(1).join("/")) };
    }
    return { view: Object.prototype.hasOwnProperty.call(TITLES, parts[0]) && parts[0] !== "source" ? parts[0] : "search" };
  }

  function headingOf(view) {
    var node = document.querySelector('.view[data-view="' + view + '"]');
    return node ? node.querySelector("h2") : null;
  }

  function showRoute(route, moveFocus) {
    currentView = route.view;
    views.forEach(function (node) { show(node, node.getAttribute("data-view") === route.view); });
    var active = NAV_OF[route.view] || route.view;
    navLinks.forEach(function (link) {
      if (link.getAttribute("data-route") === active) link.setAttribute("aria-current", "page");
      else link.removeAttribute("aria-current");
    });
    document.title = (route.view === "source" ? "Source " + route.name : TITLES[route.view]) +
      " \u00b7 Groundwork Knowledge Grounding Console";
    if (loaders[route.view]) loaders[route.view](route);
    if (moveFocus) {
      var heading = headingOf(route.view);
      if (heading) heading.focus();
    }
  }

  window.addEventListener("hashchange", function () {
    var route = parseRoute(window.location.hash);
    if (route) showRoute(route, true);
  });

  document.querySelector(".skip-link").addEventListener("click", function (event) {
    event.preventDefault();
    var heading = headingOf(currentView);
    if (currentView === "search") $("q").focus(); else if (heading) heading.focus();
  });

  // ============================================================ Sources
  var sourcesBody = $("sources-body"), sourcesStatus = $("sources-status"), sourcesSummary = $("sources-summary");
  var sourceForm = $("source-form"), sourceError = $("source-form-error"), sourceSubmit = $("source-submit"),
      sourceCancel = $("source-cancel"), sourceFormHeading = $("source-form-heading");
  var sourceFields = { name: $("source-name"), folder: $("source-folder"), url: $("source-url"), depth: $("source-depth"),
                       max_pages: $("source-max-pages"), requests_per_second: $("source-rps"), include: $("source-include"),
                       exclude: $("source-exclude"), enabled: $("source-enabled"), visibility: $("source-visibility"),
                       render_js: $("source-render-js") };
  var editing = null;   // the source being edited (its row from GET /api/sources), null when adding
  var busySource = null; // the source whose sync job is being watched
  var knownSources = [];

  function lastSyncText(source) {
    var last = source.last_sync;
    if (!last) return "never";
    return when(source.last_synced_at) + ": " + (last.added || 0) + " added, " + (last.updated || 0) + " updated, " +
      (last.removed || 0) + " removed, " + (last.unchanged || 0) + " unchanged, " + (last.excluded || 0) +
      " excluded, " + (last.failed || 0) + " failed";
  }

  function actionButton(label, ariaLabel, handler, cls) {
    var button = el("button", label, "secondary small " + (cls || ""));
    button.type = "button";
    button.setAttribute("aria-label", ariaLabel);
    button.addEventListener("click", handler);
    return button;
  }

  function deletable(source) {
    // a folder the settings name (GROUNDWORK_SOURCES, the default corpus) and the uploads folder are removed there
    return source.origin === "user" || source.configured === false;
  }

  function renderSources(sources) {
    knownSources = sources;
    sourcesBody.textContent = "";
    var documents = 0, chunks = 0;
    sources.forEach(function (source) {
      var stats = source.statistics || {};
      documents += stats.documents || 0;
      chunks += stats.chunks || 0;
      var row = el("tr");
      row.setAttribute("data-source", source.name);
      var name = el("th");
      name.scope = "row";
      var link = el("a", source.name);
      link.href = "#/sources/" + encodeURIComponent(source.name);
      link.setAttribute("aria-label", "Details of " + source.name);
      name.appendChild(link);
      row.appendChild(name);
      cell(row, source.kind + (source.enabled ? "" : " (disabled)") + (source.configured === false ? " (not configured)" : ""));
      cell(row, source.visibility || "internal");
      cell(row, source.location, "location");
      cell(row, String(stats.documents || 0), "num");
      cell(row, String(stats.chunks || 0), "num");
      cell(row, String(stats.open_failures || 0), "num");
      cell(row, lastSyncText(source) + (source.resync_needed && source.last_sync ? " \u2014 re-sync needed" : ""));
      var actions = el("td", null, "actions");
      var sync = actionButton("Sync now", "Sync " + source.name + " now", function () { syncSource(source.name); }, "sync-button");
      sync.disabled = !source.enabled || source.configured === false || busySource !== null;
      actions.appendChild(sync);
      actions.appendChild(actionButton("Edit", "Edit " + source.name, function () { startEdit(source); }));
      actions.appendChild(actionButton(source.enabled ? "Disable" : "Enable",
        (source.enabled ? "Disable " : "Enable ") + source.name, function () { setEnabled(source, !source.enabled); }));
      if (deletable(source)) {
        actions.appendChild(actionButton("Delete", "Delete " + source.name, function () { deleteSource(source); }, "danger-text"));
      }
      row.appendChild(actions);
      sourcesBody.appendChild(row);
    });
    sourcesSummary.textContent = sources.length + " sources, " + documents + " documents, " + chunks + " passages";
  }

  function loadSources() {
    return getJSON("/api/sources").then(function (body) {
      renderSources(body.sources || []);
    }, function (error) {
      say(sourcesStatus, "Cannot list the sources: " + error.message, "error");
    });
  }

  function syncSource(name, statusNode) {
    var out = statusNode || sourcesStatus;
    busySource = name;
    say(out, "Starting the sync of " + name + "\u2026");
    Array.prototype.forEach.call(document.querySelectorAll(".sync-button"), function (b) { b.disabled = true; });
    return requestJSON("POST", "/api/sources/" + encodeURIComponent(name) + "/sync", {}).then(function (res) {
      if (res.status !== 202) throw new Error(messageOf(res.body, res.status));
      return followSync(name, res.body.job_id, out);
    }).catch(function (error) {
      say(out, "Cannot sync " + name + ": " + error.message, "error");
    }).then(function () {
      busySource = null;
      return currentView === "source" ? loadSource({ name: name }, true) : loadSources();
    });
  }

  function followSync(name, jobId, out) {
    var lastText = "";
    return watchJob(jobId, function (job) {
      if (job.status === "succeeded" || job.status === "failed") return;
      var text = "Syncing " + name + "\u2026 " + jobProgressText(job);
      if (text !== lastText) { out.textContent = text; lastText = text; }
    }).then(function (job) {
      if (job.status === "succeeded") say(out, "Synced " + name + ": " + job.summary + " (index snapshot " + job.snapshot_version + ")", "ok");
      else say(out, "Sync of " + name + " failed: " + job.error, "error");
    });
  }

  function setEnabled(source, enabled) {
    requestJSON("PATCH", "/api/sources/" + encodeURIComponent(source.name), { enabled: enabled }).then(function (res) {
      if (!res.ok) throw new Error(messageOf(res.body, res.status));
      say(sourcesStatus, (enabled ? "Enabled " : "Disabled ") + source.name + "." +
        (enabled && res.body.resync_needed ? " Sync it to bring its documents up to date." : ""), "ok");
    }).catch(function (error) {
      say(sourcesStatus, "Cannot change " + source.name + ": " + error.message, "error");
    }).then(loadSources);
  }

  function deleteSource(source) {
    confirmAction("Delete source " + source.name + "?",
      "Its " + ((source.statistics || {}).documents || 0) + " documents leave the index at once and are purged after " +
      "the retention period. The files themselves are not touched.", "Delete " + source.name).then(function (ok) {
      if (!ok) { say(sourcesStatus, "Nothing deleted."); return; }
      say(sourcesStatus, "Deleting " + source.name + "\u2026");
      requestJSON("DELETE", "/api/sources/" + encodeURIComponent(source.name)).then(function (res) {
        if (!res.ok) throw new Error(messageOf(res.body, res.status));
        say(sourcesStatus, "Deleted " + source.name + ": " + res.body.documents_deleted + " documents left the index" +
          (res.body.snapshot_version ? " (index snapshot " + res.body.snapshot_version + ")" : "") + ".", "ok");
        if (editing && editing.name === source.name) stopEdit();
      }).catch(function (error) {
        say(sourcesStatus, "Cannot delete " + source.name + ": " + error.message, "error");
      }).then(loadSources);
    });
  }

  // ---- the add / edit form
  function kindOf() {
    var checked = sourceForm.querySelector('input[name="kind"]:checked');
    return checked ? checked.value : "folder";
  }

  function applyKind() {
    var web = kindOf() === "web";
    show($("source-folder-field"), !web);
    show($("source-url-field"), web);
    show($("source-web-options"), web);
  }
  Array.prototype.forEach.call(sourceForm.querySelectorAll('input[name="kind"]'), function (radio) {
    radio.addEventListener("change", applyKind);
  });

  function lines(text) {
    return text.split("\n").map(function (line) { return line.trim(); }).filter(Boolean);
  }

  function clearSourceErrors() {
    show(sourceError, false);
    sourceError.textContent = "";
    Object.keys(sourceFields).forEach(function (key) { sourceFields[key].removeAttribute("aria-invalid"); });
  }

  function sourceFormError(message, fields) {
    sourceError.textContent = message;
    show(sourceError, true);
    var first = null;
    (fields || []).forEach(function (field) {
      var input = sourceFields[String(field).split(".")[0]];
      if (input) { input.setAttribute("aria-invalid", "true"); first = first || input; }
    });
    if (first) first.focus();
  }

  function webOptions(base) {
    var options = {}, config = base || {};
    var depth = Number(sourceFields.depth.value), cap = Number(sourceFields.max_pages.value),
        rps = Number(sourceFields.requests_per_second.value);
    var include = lines(sourceFields.include.value), exclude = lines(sourceFields.exclude.value);
    var wanted = { depth: depth, max_pages: cap, requests_per_second: rps, include: include, exclude: exclude,
                   render_js: sourceFields.render_js.checked };
    Object.keys(wanted).forEach(function (key) {
      var was = key === "render_js" ? !!config[key] : config[key];  // absent (default) reads as off
      if (JSON.stringify(wanted[key]) !== JSON.stringify(was)) options[key] = wanted[key];
    });
    return options;
  }

  function checkWebNumbers() {
    var depth = Number(sourceFields.depth.value), cap = Number(sourceFields.max_pages.value),
        rps = Number(sourceFields.requests_per_second.value);
    if (!Number.isInteger(depth) || depth < 0 || depth > 5) return ["Depth must be a whole number from 0 to 5.", "depth"];
    if (!Number.isInteger(cap) || cap < 1) return ["The page cap must be a whole number of at least 1.", "max_pages"];
    if (!(rps >= 0.01)) return ["Requests per second must be at least 0.01.", "requests_per_second"];
    return null;
  }

  function startEdit(source) {
    editing = source;
    clearSourceErrors();
    sourceForm.querySelector('input[name="kind"][value="' + (source.kind === "web" ? "web" : "folder") + '"]').checked = true;
    applyKind();
    Array.prototype.forEach.call(sourceForm.querySelectorAll('input[name="kind"]'), function (r) { r.disabled = true; });
    sourceFields.name.value = source.name;
    sourceFields.folder.value = source.kind === "web" ? "" : source.location;
    sourceFields.url.value = source.kind === "web" ? source.location : "";
    sourceFields.folder.disabled = sourceFields.url.disabled = true;  // a new location is a new source
    var config = source.config || {};
    sourceFields.depth.value = config.depth === undefined ? 2 : config.depth;
    sourceFields.max_pages.value = config.max_pages === undefined ? 500 : config.max_pages;
    sourceFields.requests_per_second.value = config.requests_per_second === undefined ? 5 : config.requests_per_second;
    sourceFields.include.value = (config.include || []).join("\n");
    sourceFields.exclude.value = (config.exclude || []).join("\n");
    sourceFields.render_js.checked = !!config.render_js;
    sourceFields.enabled.checked = !!source.enabled;
    sourceFields.visibility.value = source.visibility || "internal";
    show($("source-sync-label"), false);
    sourceFormHeading.textContent = "Edit source " + source.name;
    sourceSubmit.textContent = "Save changes";
    show(sourceCancel, true);
    sourceFormHeading.focus();
  }

  function stopEdit() {
    editing = null;
    sourceForm.reset();
    Array.prototype.forEach.call(sourceForm.querySelectorAll('input[name="kind"]'), function (r) { r.disabled = false; });
    sourceFields.folder.disabled = sourceFields.url.disabled = false;
    applyKind();
    clearSourceErrors();
    show($("source-sync-label"), true);
    sourceFormHeading.textContent = "Add a source";
    sourceSubmit.textContent = "Add source";
    show(sourceCancel, false);
  }
  sourceCancel.addEventListener("click", function () {
    stopEdit();
    say(sourcesStatus, "Editing cancelled.");
    sourceFields.name.focus();
  });

  function submitResult(res) {
    if (res.ok) return res;
    var errors = (res.body && res.body.errors) || [];
    sourceFormError(messageOf(res.body, res.status), errors.map(function (e) { return e.field; }));
    return null;
  }

  sourceForm.addEventListener("submit", function (event) {
    event.preventDefault();
    clearSourceErrors();
    var kind = kindOf(), name = sourceFields.name.value.trim();
    if (!/^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$/.test(name)) {
      sourceFormError("The name needs 1\u201364 letters, digits, \u201c.\u201d, \u201c_\u201d or \u201c-\u201d, starting with a letter or digit.", ["name"]);
      return;
    }
    if (kind === "web") {
      var bad = checkWebNumbers();
      if (bad) { sourceFormError(bad[0], [bad[1]]); return; }
    }
    sourceSubmit.disabled = true;
    var done;
    if (editing) {
      var source = editing, patch = {};
      if (name !== source.name) patch.name = name;
      if (sourceFields.enabled.checked !== !!source.enabled) patch.enabled = sourceFields.enabled.checked;
      if (sourceFields.visibility.value !== (source.visibility || "internal")) patch.visibility = sourceFields.visibility.value;
      if (source.kind === "web") {
        var options = webOptions(source.config);
        Object.keys(options).forEach(function (key) { patch[key] = options[key]; });
      }
      if (!Object.keys(patch).length) {
        say(sourcesStatus, "Nothing changed in " + source.name + ".");
        sourceSubmit.disabled = false;
        return;
      }
      done = requestJSON("PATCH", "/api/sources/" + encodeURIComponent(source.name), patch).then(submitResult).then(function (res) {
        if (!res) return;
        var changed = Array.isArray(res.body.changed) ? res.body.changed.join(", ") : "";
        say(sourcesStatus, "Saved " + res.body.source.name + (changed ? " (changed " + changed + ")" : "") + ". " +
          (res.body.resync_needed ? "Sync it to apply the new rules." : "No re-sync needed."), "ok");
        stopEdit();
        return loadSources();
      });
    } else {
      var body = { name: name, kind: kind, enabled: sourceFields.enabled.checked, sync: $("source-sync").checked,
                   visibility: sourceFields.visibility.value };
      if (kind === "web") {
        body.url = sourceFields.url.value.trim();
        var opts = webOptions({});
        Object.keys(opts).forEach(function (key) { if (!(Array.isArray(opts[key]) && !opts[key].length)) body[key] = opts[key]; });
      } else {
        body.folder = sourceFields.folder.value.trim();
      }
      if (kind === "web" && !body.url) { sourceFormError("A web source needs its base URL.", ["url"]); sourceSubmit.disabled = false; return; }
      if (kind === "folder" && !body.folder) { sourceFormError("A folder source needs a folder.", ["folder"]); sourceSubmit.disabled = false; return; }
      done = requestJSON("POST", "/api/sources", body).then(submitResult).then(function (res) {
        if (!res) return;
        say(sourcesStatus, "Added " + name + " (" + kind + ")." + (res.status === 202 ? " Its first sync has started." : ""), "ok");
        stopEdit();
        loadSources();
        if (res.status === 202) {
          busySource = name;
          return followSync(name, res.body.job_id, sourcesStatus).then(function () { busySource = null; return loadSources(); });
        }
      });
    }
    done.catch(function () {
      sourceFormError("The server could not be reached; nothing was saved.");
    }).then(function () { sourceSubmit.disabled = false; });
  });

  loaders.sources = function () { loadSources(); };

  // ============================================================ One source
  var sourceStatus = $("source-status");
  var shownSource = null;

  function loadSource(route, keepStatus) {
    shownSource = route.name;
    $("source-heading").textContent = "Source " + route.name;
    if (!keepStatus) say(sourceStatus, "Loading\u2026");
    return getJSON("/api/sources/" + encodeURIComponent(route.name)).then(function (source) {
      if (shownSource !== route.name) return;
      renderSource(source);
      if (!keepStatus) say(sourceStatus, "");
    }, function (error) {
      show($("source-detail"), false);
      say(sourceStatus, "Cannot show " + route.name + ": " + error.message, "error");
    });
  }

  function renderSource(source) {
    var stats = source.statistics || {}, config = source.config || {}, last = source.last_sync;
    show($("source-detail"), true);
    var meta = $("source-meta");
    meta.textContent = "";
    meta.appendChild(document.createTextNode(source.kind + " \u00b7 " + (source.enabled ? "enabled" : "disabled") + " \u00b7 "));
    var sync = el("button", "Sync now", "secondary small");
    sync.type = "button";
    sync.setAttribute("aria-label", "Sync " + source.name + " now");
    sync.disabled = !source.enabled || busySource !== null;
    sync.addEventListener("click", function () { syncSource(source.name, sourceStatus); });
    meta.appendChild(sync);

    var settingsList = $("source-settings");
    settingsList.textContent = "";
    var href = source.kind === "web" ? safeHref(source.location) : null;
    if (href) {
      var a = el("a", source.location);
      a.href = href; a.target = "_blank"; a.rel = "noopener";
      fact(settingsList, "Location", a);
    } else {
      fact(settingsList, "Location", source.location);
    }
    fact(settingsList, "Visibility", source.visibility === "public"
      ? "public: the widget and callers without the admin token may be answered from it"
      : "internal: only callers with the admin token");
    fact(settingsList, "Origin", source.origin === "user" ? "added by hand" : "from the settings");
    fact(settingsList, "Added", when(source.created_at));
    fact(settingsList, "Changed", when(source.updated_at));
    fact(settingsList, "Re-sync needed", source.resync_needed ? "yes" : "no");
    if (source.kind === "web") {
      fact(settingsList, "Depth", config.depth);
      fact(settingsList, "Page cap", config.max_pages);
      fact(settingsList, "Include", (config.include || []).join("  ") || "everything under the base URL");
      fact(settingsList, "Exclude", (config.exclude || []).join("  ") || "nothing");
      fact(settingsList, "Requests per second", config.requests_per_second);
      fact(settingsList, "robots.txt, llms.txt, sitemaps", [config.respect_robots, config.use_llms_txt, config.use_sitemap]
        .map(function (on) { return on === false ? "off" : "on"; }).join(", "));
      fact(settingsList, "Render JavaScript", config.render_js ? "on: pages are rendered in headless Chromium" : "off");
    }

    var statsList = $("source-stats");
    statsList.textContent = "";
    fact(statsList, "Documents", stats.documents);
    fact(statsList, "Pages", stats.pages);
    fact(statsList, "Passages", stats.chunks);
    fact(statsList, "Versions pending", stats.pending_versions);
    fact(statsList, "Versions failed", stats.failed_versions);
    fact(statsList, "Deleted documents", stats.deleted_documents);
    fact(statsList, "Open failures", stats.open_failures);
    if (source.kind === "web") fact(statsList, "Web pages known", stats.web_pages_known);

    var lastList = $("source-last-sync");
    lastList.textContent = "";
    if (!last) {
      fact(lastList, "Synced", "never");
    } else {
      fact(lastList, "When", when(source.last_synced_at));
      ["added", "updated", "removed", "unchanged", "excluded", "failed", "restored"].forEach(function (key) {
        if (last[key] !== undefined) fact(lastList, words(key), last[key]);
      });
      if (last.missing) fact(lastList, "Folder", "missing at the last sync");
    }
    var crawlList = $("source-crawl"), crawl = last && last.crawl;
    crawlList.textContent = "";
    show($("source-crawl-heading"), source.kind === "web");
    show(crawlList, source.kind === "web");
    if (source.kind === "web") {
      if (!crawl) fact(crawlList, "Crawl", "not crawled yet");
      else Object.keys(crawl).sort().forEach(function (key) {
        var value = crawl[key];
        if (value !== null && typeof value === "object") value = JSON.stringify(value);
        fact(crawlList, words(key), typeof value === "boolean" ? (value ? "yes" : "no") : value);
      });
    }

    var failures = $("source-failures");
    failures.textContent = "";
    (source.open_failures || []).forEach(function (f) {
      var li = el("li");
      li.appendChild(el("span", f.path, "path"));
      li.appendChild(document.createTextNode(" \u2014 " + f.kind + ": " + f.reason));
      failures.appendChild(li);
    });
    if (!(source.open_failures || []).length) failures.appendChild(el("li", "None.", "meta"));
    else {
      var li = el("li"), link = el("a", "Retry them on the Failures page");
      link.href = "#/failures";
      li.appendChild(link);
      failures.appendChild(li);
    }

    var docs = $("source-docs");
    docs.textContent = "";
    (source.documents || []).forEach(function (d) {
      var row = el("tr"), head = el("th", d.title || d.relative_path);
      head.scope = "row";
      row.appendChild(head);
      cell(row, d.relative_path, "location");
      cell(row, d.doc_type || "");
      cell(row, String(d.version), "num");
      cell(row, d.status);
      cell(row, d.page_count === null || d.page_count === undefined ? "\u2014" : String(d.page_count), "num");
      cell(row, String(d.chunks || 0), "num");
      cell(row, when(d.indexed_at));
      docs.appendChild(row);
    });
    var listed = (source.documents || []).length;
    $("source-docs-note").textContent = listed === 0 ? "No documents." :
      (listed >= (source.documents_listed_max || Infinity) ? "The first " + listed + " documents by path." : listed + " documents.");
  }

  loaders.source = function (route) { loadSource(route); };

  // ============================================================ Upload
  var uploadInput = $("upload-input"), dropZone = $("drop-zone"), uploadList = $("upload-list"),
      uploadStatus = $("upload-status"), uploadTemplate = $("upload-template");
  var uploadConfig = null, uploadQueue = [], uploading = false;

  function prepareUpload() {
    if (uploadConfig) return;
    getJSON("/api/knowledge/config").then(function (config) {
      uploadConfig = config;
      var types = config.upload_types || [];
      uploadInput.setAttribute("accept", types.join(","));
      $("upload-hint").textContent = types.join(", ") + "; up to " + config.max_upload_mb + " MB each. Each file is " +
        "checked, stored in the uploads source and indexed; an identical file already indexed is reported as a duplicate.";
    }, function () {
      $("upload-hint").textContent = "PDF, DOCX, HTML, Markdown or text files.";
    });
  }
  loaders.upload = prepareUpload;

  function announce(text) { uploadStatus.textContent = text; }

  function setState(item, text, kind) {
    var state = item.querySelector(".upload-state");
    state.textContent = text;
    state.className = "upload-state" + (kind ? " " + kind : "");
    item.setAttribute("data-state", kind || "working");
  }

  function addFiles(files) {
    Array.prototype.forEach.call(files, function (file) {
      var item = uploadTemplate.content.firstElementChild.cloneNode(true);
      item.querySelector(".upload-name").textContent = file.name;
      item.querySelector(".upload-size").textContent = bytes(file.size);
      var progress = item.querySelector(".upload-progress");
      progress.setAttribute("aria-label", "Progress of " + file.name);
      uploadList.appendChild(item);
      var problem = clientCheck(file);
      if (problem) {
        progress.hidden = true;
        setState(item, problem, "error");
        announce(file.name + ": " + problem);
        return;
      }
      setState(item, "Waiting\u2026");
      uploadQueue.push({ file: file, item: item, force: false });
    });
    next();
  }

  function clientCheck(file) {
    if (!uploadConfig) return null;  // the server checks anyway
    var dot = file.name.lastIndexOf("."), suffix = dot >= 0 ? file.name.slice(dot).toLowerCase() : "";
    if ((uploadConfig.upload_types || []).indexOf(suffix) < 0) {
      return "Not uploaded: " + (suffix || "no extension") + " is not a supported type (" + uploadConfig.upload_types.join(", ") + ").";
    }
    if (file.size > uploadConfig.max_upload_mb * 1048576) {
      return "Not uploaded: " + bytes(file.size) + " is over the " + uploadConfig.max_upload_mb + " MB limit.";
    }
    return null;
  }

  function next() {
    if (uploading || !uploadQueue.length) return;
    uploading = true;
    var job = uploadQueue.shift();
    upload(job).then(function () {
      uploading = false;
      next();
    });
  }

  /** One file: XHR upload with its byte progress, then the ingestion job's progress until it is indexed. */
  function upload(entry) {
    var file = entry.file, item = entry.item, progress = item.querySelector(".upload-progress"),
        detail = item.querySelector(".upload-detail"), actions = item.querySelector(".upload-actions");
    actions.textContent = "";
    progress.hidden = false;
    progress.value = 0;
    setState(item, "Uploading\u2026");
    announce(file.name + ": uploading");
    return new Promise(function (resolve) {
      var xhr = new XMLHttpRequest();
      var data = new FormData();
      data.append("file", file, file.name);
      data.append("force", entry.force ? "true" : "false");
      xhr.open("POST", "/api/knowledge/ingest");
      xhr.setRequestHeader("Accept", "application/json");
      var token = shared.storedToken();
      if (token) xhr.setRequestHeader("Authorization", "Bearer " + token);
      xhr.upload.addEventListener("progress", function (event) {
        if (!event.lengthComputable) return;
        progress.value = Math.round(100 * event.loaded / event.total);
        detail.textContent = "Sent " + bytes(event.loaded) + " of " + bytes(event.total);
      });
      xhr.addEventListener("error", function () {
        progress.hidden = true;
        setState(item, "Not uploaded: the server could not be reached.", "error");
        announce(file.name + ": the server could not be reached");
        resolve();
      });
      xhr.addEventListener("load", function () {
        var body = null;
        try { body = JSON.parse(xhr.responseText); } catch (e) { body = null; }
        if (xhr.status === 202 && body) {
          ingesting(entry, body).then(resolve);
          return;
        }
        progress.hidden = true;
        if (xhr.status === 401) {  // the server wants its admin token: ask once, then send the file again
          shared.askToken(!!token).then(function (given) {
            if (given) {
              setState(item, "Waiting\u2026");
              uploadQueue.push(entry);
            } else {
              setState(item, "Not uploaded: the server needs its admin token.", "error");
              announce(file.name + ": not uploaded");
            }
            resolve();
          });
          return;
        }
        if (xhr.status === 409 && body && body.error === "duplicate") {
          setState(item, "Duplicate: " + messageOf(body, xhr.status) + ". Not uploaded again.", "duplicate");
          detail.textContent = "";
          var again = el("button", "Upload anyway", "secondary small");
          again.type = "button";
          again.setAttribute("aria-label", "Upload " + file.name + " anyway");
          again.addEventListener("click", function () {
            uploadQueue.push({ file: file, item: item, force: true });
            setState(item, "Waiting\u2026");
            next();
          });
          actions.appendChild(again);
          announce(file.name + ": duplicate of an indexed document");
        } else {
          setState(item, "Not uploaded: " + messageOf(body, xhr.status), "error");
          detail.textContent = "HTTP " + xhr.status;
          announce(file.name + ": not uploaded");
        }
        resolve();
      });
      xhr.send(data);
    });
  }

  function ingesting(entry, accepted) {
    var file = entry.file, item = entry.item, progress = item.querySelector(".upload-progress"),
        detail = item.querySelector(".upload-detail");
    progress.value = 0;
    progress.removeAttribute("value");  // indeterminate until a stage reports counts
    setState(item, "Uploaded as " + accepted.stored_as + "; indexing\u2026");
    announce(file.name + ": uploaded, indexing");
    return watchJob(accepted.job_id, function (job) {
      var pct = stagePercent(job);
      if (pct !== null) progress.value = pct;
      var text = jobProgressText(job);
      detail.textContent = job.status === "queued" ? "Queued behind another ingestion job" : (text || "Starting\u2026");
    }).then(function (job) {
      if (job.status === "succeeded") {
        progress.value = 100;
        setState(item, "Indexed: " + job.summary + " (index snapshot " + job.snapshot_version + ")", "ok");
        detail.textContent = (job.documents_indexed !== undefined ? job.documents_indexed + " documents, " +
          job.chunks_indexed + " passages in the index now" : "");
        announce(file.name + ": indexed");
      } else {
        progress.hidden = true;
        setState(item, "Indexing failed: " + job.error, "error");
        announce(file.name + ": indexing failed");
      }
    }, function () {
      progress.hidden = true;
      setState(item, "Lost contact with the server while indexing; check the Sources page.", "error");
    });
  }

  uploadInput.addEventListener("change", function () {
    addFiles(uploadInput.files);
    uploadInput.value = "";
  });
  ["dragenter", "dragover"].forEach(function (name) {
    dropZone.addEventListener(name, function (event) {
      event.preventDefault();
      dropZone.classList.add("dragging");
    });
  });
  ["dragleave", "drop"].forEach(function (name) {
    dropZone.addEventListener(name, function () { dropZone.classList.remove("dragging"); });
  });
  dropZone.addEventListener("drop", function (event) {
    event.preventDefault();
    if (event.dataTransfer && event.dataTransfer.files.length) addFiles(event.dataTransfer.files);
  });
  // a file dropped next to the zone must not replace the console with the file
  window.addEventListener("dragover", function (event) { event.preventDefault(); });
  window.addEventListener("drop", function (event) { event.preventDefault(); });

  // ============================================================ Failures
  var failuresBody = $("failures-body"), failuresStatus = $("failures-status");

  function loadFailures() {
    return Promise.all([getJSON("/api/failures"), getJSON("/api/sources").catch(function () { return { sources: [] }; })])
      .then(function (answers) {
        var names = {};
        (answers[1].sources || []).forEach(function (s) { names[s.source_id] = s.name; });
        renderFailures(answers[0].failures || [], names);
      }, function (error) {
        say(failuresStatus, "Cannot list the failures: " + error.message, "error");
      });
  }

  function renderFailures(failures, names) {
    failuresBody.textContent = "";
    show($("failures-empty"), failures.length === 0);
    show($("failures-table"), failures.length > 0);
    $("failures-summary").textContent = failures.length + (failures.length === 1 ? " open failure" : " open failures");
    failures.forEach(function (f) {
      var row = el("tr");
      row.setAttribute("data-failure", f.failure_id);
      var head = el("th", null, "location");
      head.scope = "row";
      var href = /^https?:/i.test(f.path) ? safeHref(f.path) : null;
      if (href) {
        var a = el("a", f.path);
        a.href = href; a.target = "_blank"; a.rel = "noopener";
        head.appendChild(a);
      } else {
        head.textContent = f.path;
      }
      row.appendChild(head);
      cell(row, names[f.source_id] || f.source_id || "\u2014");
      cell(row, f.stage);
      var reason = cell(row, "");
      reason.appendChild(el("span", f.kind, "badge"));
      reason.appendChild(document.createTextNode(" " + f.reason));
      reason.appendChild(failureFacts(f));
      cell(row, when(f.last_seen_at));
      var action = el("td", null, "actions");
      var retry = el("button", "Retry", "secondary small retry-button");
      retry.type = "button";
      retry.setAttribute("aria-label", "Retry " + f.path);
      retry.addEventListener("click", function () { retryFailure(f); });
      action.appendChild(retry);
      row.appendChild(action);
      failuresBody.appendChild(row);
    });
  }

  // attempts and class, the input (size, sha256) and the last attempt's traceback (redacted by the server)
  function failureFacts(f) {
    var box = el("div", null, "meta failure-facts");
    var facts = [];
    if (f.attempts) facts.push(f.attempts + (f.attempts === 1 ? " attempt" : " attempts"));
    if (f.failure_class) facts.push(f.failure_class === "transient" ? "transient (retried)" : "permanent (not retried)");
    if (f.input_size_bytes !== null && f.input_size_bytes !== undefined) facts.push(f.input_size_bytes + " bytes");
    if (f.input_sha256) facts.push("sha256 " + f.input_sha256);
    box.appendChild(el("span", facts.join(" \u00b7 ")));
    if (f.traceback) {
      var details = el("details", null, "failure-traceback");
      details.appendChild(el("summary", "Traceback"));
      details.appendChild(el("pre", f.traceback));
      box.appendChild(details);
    }
    return box;
  }

  function retryFailure(failure) {
    Array.prototype.forEach.call(failuresBody.querySelectorAll(".retry-button"), function (b) { b.disabled = true; });
    say(failuresStatus, "Retrying " + failure.path + "\u2026");
    requestJSON("POST", "/api/failures/" + encodeURIComponent(failure.failure_id) + "/retry", {}).then(function (res) {
      if (res.status !== 202) throw new Error(messageOf(res.body, res.status));
      var lastText = "";
      return watchJob(res.body.job_id, function (job) {
        var text = "Retrying " + failure.path + "\u2026 " + jobProgressText(job);
        if (job.status !== "succeeded" && job.status !== "failed" && text !== lastText) {
          failuresStatus.textContent = text;
          lastText = text;
        }
      });
    }).then(function (job) {
      if (job.status === "failed") {
        say(failuresStatus, "Retry of " + failure.path + " failed: " + job.error, "error");
      } else if (job.resolved) {
        say(failuresStatus, "Resolved: " + failure.path + " is indexed now (" + job.summary + ").", "ok");
      } else {
        var still = job.still_failing || {};
        say(failuresStatus, "Still failing: " + failure.path + " \u2014 " + (still.kind ? still.kind + ": " : "") +
          (still.reason || "the same problem") + " (" + job.summary + ").", "error");
      }
    }).catch(function (error) {
      say(failuresStatus, "Cannot retry " + failure.path + ": " + error.message, "error");
    }).then(function () {
      return loadFailures();
    }).then(function () {
      var again = failuresBody.querySelector('tr[data-failure="' + CSS.escape(failure.failure_id) + '"] .retry-button');
      (again || $("failures-heading")).focus();
    });
  }

  // the documents list filtered to needs_review: scans with low-confidence OCR regions
  function loadReview() {
    var list = $("review-list");
    return getJSON("/api/knowledge/documents?include_history=false&needs_review=true").then(function (answer) {
      list.textContent = "";
      var docs = (answer.documents || []).filter(function (d) { return d.status === "active"; });
      docs.forEach(function (d) {
        list.appendChild(el("li", (d.title || d.relative_path) + " \u2014 " + d.low_confidence_regions +
          (d.low_confidence_regions === 1 ? " low-confidence region" : " low-confidence regions") +
          " (" + d.relative_path + ")"));
      });
      if (!docs.length) list.appendChild(el("li", "None.", "meta"));
    }, function (error) {
      list.textContent = "";
      list.appendChild(el("li", "Cannot list them: " + error.message, "meta"));
    });
  }

  loaders.failures = function () { loadFailures(); loadReview(); };

  // ============================================================ Settings (corpus ranking defaults)
  var rankingForm = $("ranking-form"), rankingAlpha = $("ranking-alpha"), rankingAlphaValue = $("ranking-alpha-value"),
      rankingFusion = $("ranking-fusion"), rankingReranker = $("ranking-reranker"), rankingStatus = $("ranking-status"),
      rankingError = $("ranking-error"), rankingSave = $("ranking-save");
  var RANKING_CONTROLS = { alpha: rankingAlpha, fusion: rankingFusion, reranker: rankingReranker };
  var SOURCE_TEXT = { setting: "set explicitly in the server's environment", console: "set here",
                      tuned: "chosen by groundwork tune", "default": "built-in default" };
  var ranking = null, dirty = {};

  function rankingValueText(name, value) {
    return name === "alpha" ? fmt(value, 2) : String(value);
  }

  function options(select, values, labels, chosen) {
    select.textContent = "";
    values.forEach(function (value) {
      var option = el("option", labels[value] || value);
      option.value = value;
      select.appendChild(option);
    });
    select.value = chosen;
  }

  function renderRanking(data) {
    ranking = data;
    dirty = {};
    rankingAlpha.value = String(data.alpha.effective);
    rankingAlphaValue.textContent = fmt(data.alpha.effective, 2);
    var fusionLabels = {};
    Object.keys(data.fusion_modes).forEach(function (mode) { fusionLabels[mode] = mode + " \u2014 " + data.fusion_modes[mode]; });
    options(rankingFusion, Object.keys(data.fusion_modes), fusionLabels, data.fusion.effective);
    options(rankingReranker, data.rerankers, data.reranker_labels || {}, data.reranker.effective);
    ["alpha", "fusion", "reranker"].forEach(function (name) {
      var v = data[name], note = $("ranking-" + name + "-source");
      var text = "In use: " + rankingValueText(name, v.effective) + " (" + SOURCE_TEXT[v.source] + ")";
      if (v.pinned_by) text += " \u2014 pinned by " + v.pinned_by + ", which wins over a value set here";
      if (v.source !== "console" && v.tuned !== null && v.tuned !== undefined && v.source !== "tuned") {
        text += "; groundwork tune chose " + rankingValueText(name, v.tuned);
      }
      if (v.source !== "default" && v.builtin !== v.effective) text += "; built-in " + rankingValueText(name, v.builtin);
      note.textContent = text + ".";
      note.classList.toggle("pinned", !!v.pinned_by);
      RANKING_CONTROLS[name].removeAttribute("aria-invalid");
    });
    var notes = $("ranking-notes");
    notes.textContent = "";
    (data.notes || []).forEach(function (text) { notes.appendChild(el("li", text)); });
    $("ranking-file").textContent = data.stored_in;
    var stored = ["alpha", "fusion", "reranker"].some(function (n) { return data[n].stored !== null; });
    $("ranking-forget").disabled = !stored;
  }

  function loadRanking() {
    return getJSON("/api/knowledge/ranking").then(renderRanking, function (error) {
      say(rankingStatus, "Cannot read the ranking settings: " + error.message, "error");
    });
  }
  /** Which embedding model serves and the last fine-tuning decision (GET /api/knowledge/config: embedding_model). */
  function renderModel(model) {
    var facts = $("model-facts");
    facts.textContent = "";
    if (!model) return;
    fact(facts, "Serving", (model.served_model_id || model.base_model_id) + (model.fine_tuned
      ? " \u2014 fine-tuned for this corpus, adopted " + when(model.adopted_at) : " \u2014 the base model"));
    var graphs = model.graphs || {};
    /* what runs on this CPU: the quantised graph only where it passed its fidelity check against fp32 */
    function running(purpose, asked) {
      var decision = graphs[purpose];
      if (!decision) return asked && asked !== "none" ? asked : "fp32";
      if (decision.in_effect === null || decision.in_effect === undefined) return asked + " (not checked on this CPU yet)";
      return decision.in_effect === "none" ? "fp32" + (asked !== "none" ? " (" + asked + " asked for)" : "") : decision.in_effect;
    }
    fact(facts, "Vectors", "documents " + running("documents", model.document_quantization) + ", queries " +
      running("queries", model.query_quantization) + (model.sentence_encoding === "in_context"
        ? ", sentences pooled from their chunks' pass" : model.sentence_encoding ? ", sentences embedded one by one" : "") +
      " (GROUNDWORK_DOCUMENT_QUANTIZATION, GROUNDWORK_QUERY_QUANTIZATION, GROUNDWORK_SENTENCE_ENCODING)");
    ["documents", "queries"].forEach(function (purpose) {
      var decision = graphs[purpose];
      if (decision && decision.requested !== "none") {
        fact(facts, "Model graph (" + purpose + ")", decision.reason);
      }
    });
    if (graphs.cache_dir) fact(facts, "Model cache", graphs.cache_dir + " (" + graphs.cpu + ")");
    fact(facts, "Fine-tuning", model.finetune_enabled ? "on: runs after syncs that change the corpus, within " +
      fmt(model.budget_s, 0) + " s of training" : "off (GROUNDWORK_FINETUNE_EMBEDDER=false)");
    var last = model.last_decision;
    if (!last) {
      fact(facts, "Last decision", "none yet");
      return;
    }
    fact(facts, "Last decision", words(last.decision || "") + ", " + when(last.finished_at || last.created_at) +
      (typeof last.gain === "number" ? ": nDCG@10 on held-out pseudo-queries " + signed(last.gain) + " \u00b1 " +
       fmt(last.standard_error) : ""));
    fact(facts, "Why", last.reason || "");
    if (last.before && last.after && typeof last.before["ndcg@10"] === "number") {
      fact(facts, "Held-out figures", "nDCG@10 " + fmt(last.before["ndcg@10"]) + " \u2192 " + fmt(last.after["ndcg@10"]) +
        ", Recall@5 " + fmt(last.before["recall@5"]) + " \u2192 " + fmt(last.after["recall@5"]) + " (" +
        (last.held_out || 0) + " queries, " + (last.pairs || 0) + " training pairs, " + fmt(last.seconds, 0) + " s)");
    }
  }

  /** Whether ratings retrain the query adapter, the last decision and when the next check runs
   * (GET /api/knowledge/config: feedback_learning). */
  function renderLearning(learning) {
    var facts = $("learning-facts");
    facts.textContent = "";
    if (!learning) return;
    fact(facts, "Retraining", learning.enabled ? "on: after every " + learning.retrain_votes + " new thumbs-up" :
      "off (GROUNDWORK_LEARN_FROM_FEEDBACK=false): ratings are stored, nothing retrains from them");
    if (learning.enabled) {
      fact(facts, "Next retrain", typeof learning.until_next_retrain !== "number" ? "—" :
        learning.until_next_retrain === 0 ? "at the next check (" + learning.new_up_votes + " new thumbs-up)" :
        "after " + learning.until_next_retrain + " more thumbs-up (" + learning.new_up_votes + " of " +
        learning.retrain_votes + " so far)");
      var check = learning.last_check;
      fact(facts, "Checks", "every " + Math.round(learning.check_interval_s / 60) + " min" + (check
        ? "; last " + when(check.at) + " (" + check.message + "), next " + when(learning.next_check_at)
        : "; none yet: the sensor runs while Dagster (make run) is up"));
    }
    var last = learning.last_decision;
    if (!last) {
      fact(facts, "Last decision", "none yet");
      return;
    }
    fact(facts, "Last decision", words(last.decision) + ", " + when(last.decided_at) + " on " +
      (typeof last.rated_queries === "number" ? last.rated_queries + " rated queries" : "the ratings") + " (" +
      last.up_votes + " thumbs-up)" + (typeof last.gain === "number" ? ": paired nDCG@10 gain " + signed(last.gain) +
      " ± " + fmt(last.standard_error) + ", needs above " + fmt(last.required) : ""));
    fact(facts, "Why", last.reason || "");
  }

  function loadModel() {
    return getJSON("/api/knowledge/config").then(function (config) {
      renderModel(config.embedding_model);
      renderLearning(config.feedback_learning);
    },
      function (error) { say($("model-status"), "Cannot read the embedding model: " + error.message, "error"); });
  }
  loaders.settings = function () { loadRanking(); loadModel(); };

  rankingAlpha.addEventListener("input", function () {
    rankingAlphaValue.textContent = fmt(Number(rankingAlpha.value), 2);
    dirty.alpha = true;
  });
  rankingFusion.addEventListener("change", function () { dirty.fusion = true; });
  rankingReranker.addEventListener("change", function () { dirty.reranker = true; });

  function rankingSummary(data) {
    return "alpha " + fmt(data.alpha.effective, 2) + ", " + data.fusion.effective + " fusion, reranker " + data.reranker.effective;
  }

  function sendRanking(method, payload, done) {
    show(rankingError, false);
    rankingSave.disabled = true;
    return requestJSON(method, "/api/knowledge/ranking", payload).then(function (res) {
      if (!res.ok) {
        var errors = (res.body && res.body.errors) || [];
        rankingError.textContent = messageOf(res.body, res.status);
        show(rankingError, true);
        errors.forEach(function (e) { if (RANKING_CONTROLS[e.field]) RANKING_CONTROLS[e.field].setAttribute("aria-invalid", "true"); });
        say(rankingStatus, "Not saved.", "error");
        return;
      }
      renderRanking(res.body);
      say(rankingStatus, done + " Searches that do not choose their own now use " + rankingSummary(res.body) + ".", "ok");
      window.dispatchEvent(new CustomEvent("groundwork:ranking-changed"));
    }, function () {
      say(rankingStatus, "The server could not be reached; nothing was saved.", "error");
    }).then(function () { rankingSave.disabled = false; });
  }

  rankingForm.addEventListener("submit", function (event) {
    event.preventDefault();
    var payload = {};
    if (dirty.alpha) payload.alpha = Number(rankingAlpha.value);
    if (dirty.fusion) payload.fusion = rankingFusion.value;
    if (dirty.reranker) payload.reranker = rankingReranker.value;
    if (!Object.keys(payload).length) { say(rankingStatus, "Nothing changed."); return; }
    sendRanking("PUT", payload, "Saved.");
  });

  $("ranking-forget").addEventListener("click", function () {
    sendRanking("PUT", { alpha: null, fusion: null, reranker: null }, "Forgot the values set here.");
  });

  $("ranking-reset").addEventListener("click", function () {
    confirmAction("Reset the ranking to the built-in defaults?",
      "This forgets the values set here and groundwork tune's choice for this corpus (like groundwork tune --reset). " +
      "Settings from the environment still apply.", "Reset").then(function (ok) {
      if (ok) sendRanking("DELETE", undefined, "Back to the built-in defaults.");
      else say(rankingStatus, "Nothing changed.");
    });
  });

  // ============================================================ Evaluation
  var evaluationStatus = $("evaluation-status");
  var SERIES_COLOURS = ["#1d4ed8", "#b45309", "#166534", "#7c3aed", "#be123c"];
  var SVG_NS = "http://www.w3.org/2000/svg";

  function loadEvaluation() {
    say(evaluationStatus, "Loading\u2026");
    return getJSON("/api/evaluation/summary").then(function (summary) {
      say(evaluationStatus, "");
      renderEvaluation(summary);
    }, function (error) {
      say(evaluationStatus, "Cannot read the evaluation results: " + error.message, "error");
    });
  }
  loaders.evaluation = function () { loadEvaluation(); };

  function renderEvaluation(summary) {
    show($("evaluation-empty"), !!summary.empty);
    $("evaluation-empty-text").textContent = summary.hint || "";
    $("evaluation-meta").textContent = summary.empty ? "" : "From " + summary.results_path +
      " and the notebooks' output, as the evaluation runs wrote them.";
    renderScorecards(summary.scorecard || [], summary.metrics || []);
    renderSweeps(summary.alpha_sweeps || []);
    renderQuestions(summary.questions || []);
    renderHelpful(summary.helpful);
    renderDrift(summary.drift);
    renderFeedbackRagas(summary.feedback_ragas);
    renderQueryLogEval(summary.query_log_eval);
  }

  /** feedback_eval's RAGAS figures: one row per suite configuration (evals/suites/feedback.yaml). */
  function renderFeedbackRagas(run) {
    show($("feedback-ragas-panel"), !!run);
    if (!run) return;
    $("feedback-ragas-meta").textContent = "feedback_eval run of " + when(run.created_at) + ": " + run.samples +
      " rated queries with a thumbs-up passage as references, scored on today's index with RAGAS (non-LLM).";
    var body = $("feedback-ragas-body");
    body.textContent = "";
    Object.keys(run.by_configuration || {}).forEach(function (name) {
      var m = run.by_configuration[name], row = el("tr");
      cell(row, name);
      ["ragas_recall@5", "ragas_context_recall@5", "ragas_context_precision@5", "downrated_in_top5"].forEach(function (k) {
        cell(row, m[k] === undefined || m[k] === null ? "n/a" : fmt(m[k], 3), "num");
      });
      body.appendChild(row);
    });
  }

  /** query_log_eval's figures per answer method; a metric without a value shows why. */
  function renderQueryLogEval(run) {
    show($("query-log-eval-panel"), !!run);
    if (!run) return;
    $("query-log-eval-meta").textContent = "query_log_eval run of " + when(run.created_at) + ": " + (run.queries || 0) +
      " logged answers; judge: " + (run.judge_model || "none (answer support and key facts only)") + ".";
    var body = $("query-log-eval-body");
    body.textContent = "";
    Object.keys(run.by_method || {}).forEach(function (method) {
      var entry = run.by_method[method], row = el("tr");
      cell(row, method);
      ["faithfulness", "answer_relevancy", "answer_support", "key_fact_recall"].forEach(function (k) {
        var value = (entry.metrics || {})[k], note = (entry.unavailable || {})[k];
        var td = cell(row, value !== undefined ? fmt(value, 3) : (note && note.status === "failed" ? "failed" : "n/a"), "num");
        if (note && td) td.title = note.reason;
      });
      body.appendChild(row);
    });
  }

  /** A metric's value and its change since the previous run, marked worse/better in the metric's own direction. */
  function deltaCell(row, value, previous, digits, higherIsBetter) {
    var td = cell(row, fmt(value, digits), "num");
    if (previous === null || previous === undefined || typeof value !== "number") return td;
    var change = value - previous, small = el("span", " (" + signed(change, digits) + ")", "delta");
    var gain = higherIsBetter === false ? -change : change;
    if (gain < -0.02) { small.classList.add("worse"); small.setAttribute("title", "worse by more than 0.02 since the previous run"); }
    else if (gain > 0.0005) small.classList.add("better");
    td.appendChild(small);
    return td;
  }

  /** One table per dataset and split; the metric columns are the server's metric registry, in its order. */
  function renderScorecards(rows, metrics) {
    var box = $("scorecards");
    box.textContent = "";
    show($("scorecard-panel"), rows.length > 0);
    var groups = {};
    var order = [];
    rows.forEach(function (r) {
      var key = r.dataset + " (" + r.split + ")";
      if (!groups[key]) { groups[key] = []; order.push(key); }
      groups[key].push(r);
    });
    order.forEach(function (key) {
      var wrap = el("div", null, "table-scroll");
      var table = el("table", null, "sources-table scorecard-table");
      var caption = el("caption", key);
      table.appendChild(caption);
      var head = el("thead"), tr = el("tr");
      [["Configuration"], ["Alpha", "num"], ["Fusion"], ["Reranker"], ["Queries", "num"]].concat(
        metrics.map(function (m) { return [m.label + (m.headline ? " (change)" : ""), "num", m.description]; }),
        [["Answers", null, "How the scored answers were written; for generated ones, the model that judged them and the RAGAS version"],
         ["Run"]]).forEach(function (c) {
        var th = el("th", c[0], c[1]);
        th.scope = "col";
        if (c[2]) th.title = c[2];
        tr.appendChild(th);
      });
      head.appendChild(tr);
      table.appendChild(head);
      var body = el("tbody");
      groups[key].forEach(function (r) {
        var row = el("tr"), name = el("th", r.configuration);
        name.scope = "row";
        row.appendChild(name);
        cell(row, fmt(r.alpha, 2), "num");
        cell(row, r.fusion || "\u2014");
        cell(row, r.reranker || "\u2014");
        cell(row, String(r.queries), "num");
        var values = r.metrics || {}, before = (r.previous && r.previous.metrics) || null;
        var missing = r.unavailable || {};
        metrics.forEach(function (m) {
          var note = missing[m.name];
          if (note) {
            // no value: not applicable (e.g. grounding of extractive answers) or failed (the judge's error)
            var td = cell(row, note.status === "not_applicable" ? "n/a" : "failed", "num");
            td.title = (note.status === "not_applicable" ? "Not applicable: " : "Failed: ") + note.reason;
            if (note.status !== "not_applicable") td.classList.add("worse");
          } else if (m.headline) deltaCell(row, values[m.name], before ? before[m.name] : null, m.digits, m.higher_is_better);
          else cell(row, fmt(values[m.name], m.digits), "num");
        });
        cell(row, r.judge_model ? (r.answer_method || "llm") + ", judged by " + r.judge_model +
          (r.ragas_version ? " (RAGAS " + r.ragas_version + ")" : "") : (r.answer_method || "\u2014"));
        cell(row, when(r.created_at));
        body.appendChild(row);
      });
      table.appendChild(body);
      wrap.appendChild(table);
      box.appendChild(wrap);
    });
  }

  function svg(tag, attrs, text) {
    var node = document.createElementNS(SVG_NS, tag);
    Object.keys(attrs || {}).forEach(function (key) { node.setAttribute(key, String(attrs[key])); });
    if (text !== undefined) node.textContent = String(text);
    return node;
  }

  /** A line chart of score against alpha: one line per series, marks as outlined points; text only via textContent. */
  function chart(sweep, id) {
    var W = 560, H = 260, L = 48, R = 16, T = 14, B = 40;
    var values = [];
    sweep.series.forEach(function (s) { s.points.forEach(function (p) { values.push(p[1]); }); });
    (sweep.marks || []).forEach(function (m) { values.push(m.point[1]); });
    var low = Math.max(0, Math.floor((Math.min.apply(null, values) - 0.02) * 10) / 10);
    var high = Math.min(1, Math.ceil((Math.max.apply(null, values) + 0.02) * 10) / 10);
    if (high <= low) high = Math.min(1, low + 0.1);
    var x = function (a) { return L + (W - L - R) * a; };
    var y = function (v) { return T + (H - T - B) * (1 - (v - low) / (high - low)); };
    var root = svg("svg", { viewBox: "0 0 " + W + " " + H, width: "100%", role: "img", "aria-labelledby": id + "-title " + id + "-desc",
                            "class": "sweep-chart" });
    root.appendChild(svg("title", { id: id + "-title" }, sweep.y_label + " against alpha, " + sweep.dataset + " (" + sweep.split + ")"));
    var best = sweep.series.map(function (s) {
      var top = s.points.reduce(function (a, b) { return b[1] > a[1] ? b : a; }, s.points[0] || [0, 0]);
      return s.name + " best " + fmt(top[1]) + " at alpha " + fmt(top[0], 2);
    });
    root.appendChild(svg("desc", { id: id + "-desc" }, best.join("; ") + "."));
    for (var i = 0; i <= 4; i++) {
      var a = i / 4, v = low + (high - low) * i / 4;
      root.appendChild(svg("line", { x1: x(a), x2: x(a), y1: T, y2: H - B, "class": "grid" }));
      root.appendChild(svg("text", { x: x(a), y: H - B + 16, "text-anchor": "middle", "class": "tick" }, fmt(a, 2)));
      root.appendChild(svg("line", { x1: L, x2: W - R, y1: y(v), y2: y(v), "class": "grid" }));
      root.appendChild(svg("text", { x: L - 6, y: y(v) + 4, "text-anchor": "end", "class": "tick" }, fmt(v, 2)));
    }
    root.appendChild(svg("text", { x: L + (W - L - R) / 2, y: H - 6, "text-anchor": "middle", "class": "axis-label" }, sweep.x_label));
    sweep.series.forEach(function (s, index) {
      var colour = SERIES_COLOURS[index % SERIES_COLOURS.length];
      root.appendChild(svg("polyline", { points: s.points.map(function (p) { return x(p[0]) + "," + y(p[1]); }).join(" "),
                                         fill: "none", stroke: colour, "stroke-width": 2 }));
      s.points.forEach(function (p) {
        var dot = svg("circle", { cx: x(p[0]), cy: y(p[1]), r: 3.5, fill: colour });
        dot.appendChild(svg("title", {}, s.name + " at alpha " + fmt(p[0], 2) + ": " + fmt(p[1])));
        root.appendChild(dot);
      });
    });
    (sweep.marks || []).forEach(function (m, index) {
      var mark = svg("rect", { x: x(m.point[0]) - 6, y: y(m.point[1]) - 6, width: 12, height: 12, fill: index ? "#111827" : "none",
                               stroke: "#111827", "stroke-width": 2, transform: "rotate(45 " + x(m.point[0]) + " " + y(m.point[1]) + ")" });
      mark.appendChild(svg("title", {}, m.name + ": " + fmt(m.point[1])));
      root.appendChild(mark);
    });
    return root;
  }

  function legend(sweep) {
    var list = el("ul", null, "legend");
    sweep.series.forEach(function (s, index) {
      var li = el("li");
      var swatch = el("span", null, "swatch");
      swatch.style.background = SERIES_COLOURS[index % SERIES_COLOURS.length];
      li.appendChild(swatch);
      li.appendChild(document.createTextNode(s.name));
      list.appendChild(li);
    });
    (sweep.marks || []).forEach(function (m, index) {
      var li = el("li");
      li.appendChild(el("span", null, "swatch diamond" + (index ? " filled" : "")));
      li.appendChild(document.createTextNode(m.name + " (" + fmt(m.point[1]) + ")"));
      list.appendChild(li);
    });
    return list;
  }

  function sweepTable(sweep) {
    var details = el("details", null, "sweep-data");
    details.appendChild(el("summary", "Data points"));
    var table = el("table", null, "sources-table");
    table.appendChild(el("caption", sweep.y_label + " per alpha", "visually-hidden"));
    var alphas = [];
    sweep.series.forEach(function (s) { s.points.forEach(function (p) { if (alphas.indexOf(p[0]) < 0) alphas.push(p[0]); }); });
    alphas.sort(function (a, b) { return a - b; });
    var head = el("tr"), th = el("th", "Alpha", "num");
    th.scope = "col";
    head.appendChild(th);
    sweep.series.forEach(function (s) { var h = el("th", s.name, "num"); h.scope = "col"; head.appendChild(h); });
    var thead = el("thead");
    thead.appendChild(head);
    table.appendChild(thead);
    var body = el("tbody");
    alphas.forEach(function (a) {
      var row = el("tr"), rh = el("th", fmt(a, 2), "num");
      rh.scope = "row";
      row.appendChild(rh);
      sweep.series.forEach(function (s) {
        var point = s.points.filter(function (p) { return p[0] === a; })[0];
        cell(row, point ? fmt(point[1]) : "\u2014", "num");
      });
      body.appendChild(row);
    });
    table.appendChild(body);
    details.appendChild(table);
    return details;
  }

  function renderSweeps(sweeps) {
    var box = $("sweeps");
    box.textContent = "";
    show($("sweeps-panel"), sweeps.length > 0);
    sweeps.forEach(function (sweep, index) {
      var figure = el("figure", null, "sweep");
      figure.appendChild(chart(sweep, "sweep-" + index));
      figure.appendChild(legend(sweep));
      var caption = el("figcaption", sweep.dataset + " (" + sweep.split + ") \u00b7 " + sweep.source + " \u00b7 " + when(sweep.created_at));
      figure.appendChild(caption);
      figure.appendChild(sweepTable(sweep));
      box.appendChild(figure);
    });
  }

  /** Per dataset: each question, the rank its answering passage was found at (the rank Recall@k counts) and the
   *  best passage of its first judged units, ticked when judged relevant. */
  function renderQuestions(runs) {
    var box = $("questions");
    box.textContent = "";
    show($("questions-panel"), runs.length > 0);
    runs.forEach(function (run) {
      var wrap = el("div", null, "table-scroll");
      var table = el("table", null, "sources-table questions-table");
      table.appendChild(el("caption", run.dataset + " (" + run.split + ") \u00b7 " + run.configuration + " \u00b7 " +
        run.found + " of " + run.total + " found in the first " + run.found_within + " (Recall@" + run.found_within +
        " " + fmt(run.total ? run.found / run.total : 0, 3) + ") \u00b7 " + when(run.created_at)));
      var head = el("tr");
      ["Question", "Should find", "Found at", "First hits"].forEach(function (text) {
        var th = el("th", text);
        th.scope = "col";
        head.appendChild(th);
      });
      var thead = el("thead");
      thead.appendChild(head);
      table.appendChild(thead);
      var body = el("tbody");
      (run.questions || []).forEach(function (q) {
        var row = el("tr"), name = el("th", q.query);
        name.scope = "row";
        row.appendChild(name);
        cell(row, q.expected || "\u2014");
        cell(row, q.found_rank ? "#" + q.found_rank : "not in the first " + run.found_within, "num");
        var list = el("ol", null, "hit-list");
        (q.hits || []).forEach(function (h) {
          var item = el("li", h.title + (h.section ? " \u203a " + h.section : "") + (h.relevant === true ? " \u2713" : "") +
            (h.holds_answer ? " (holds the answer)" : ""));
          if (h.relevant) item.className = "relevant";
          list.appendChild(item);
        });
        var td = el("td");
        td.appendChild(list);
        row.appendChild(td);
        body.appendChild(row);
      });
      table.appendChild(body);
      wrap.appendChild(table);
      box.appendChild(wrap);
    });
  }

  function renderHelpful(helpful) {
    show($("helpful-panel"), !!helpful);
    if (!helpful) return;
    var overall = helpful.overall || {};
    $("helpful-summary").textContent = overall.rated ? percent(overall.helpful_rate) + " helpful" : "No thumbs yet";
    $("helpful-meta").textContent = (overall.rated ? overall.up + " of " + overall.rated + " judgements were thumbs up. " : "") +
      "feedback_eval run of " + when(helpful.created_at) + ": " + helpful.samples + " queries with thumbs, " +
      helpful.samples_with_references + " with a helpful passage; today's engine finds " + fmt(helpful["recall@5"], 2) +
      " of those in its top 5 (Recall@5) and shows " + helpful.unhelpful_passages_in_top5 + " thumbs-down passages there.";
    var body = $("helpful-body");
    body.textContent = "";
    (helpful.by_configuration || []).forEach(function (r) {
      var row = el("tr");
      cell(row, r.alpha === null || r.alpha === undefined ? "default" : fmt(r.alpha, 2), "num");
      cell(row, r.fusion || "default");
      cell(row, r.reranker || "default");
      cell(row, String(r.up), "num");
      cell(row, String(r.down), "num");
      cell(row, percent(r.helpful_rate), "num");
      body.appendChild(row);
    });
  }

  function renderDrift(drift) {
    show($("drift-panel"), !!drift);
    if (!drift) return;
    $("drift-summary").textContent = drift.queries_replayed ? "Top-5 overlap " + fmt(drift.mean_top5_overlap, 2) : "No queries to replay";
    $("drift-meta").textContent = "query_log_drift run of " + when(drift.created_at) + ": " + drift.queries_replayed +
      " logged queries replayed on today's index, " + drift.changed_queries + " with changed top-5 passages" +
      (drift.skipped ? ", " + drift.skipped + " skipped" : "") + ".";
    var body = $("drift-body");
    body.textContent = "";
    (drift.changed || []).forEach(function (r) {
      var row = el("tr"), q = el("th", r.query);
      q.scope = "row";
      row.appendChild(q);
      cell(row, fmt(r.overlap, 2), "num");
      cell(row, String((r.added || []).length), "num");
      cell(row, String((r.removed || []).length), "num");
      body.appendChild(row);
    });
    show($("drift-table"), (drift.changed || []).length > 0);
    var earlier = (drift.history || []).slice(1);
    $("drift-history").textContent = earlier.length ? "Earlier runs: " + earlier.map(function (h) {
      return when(h.created_at) + " overlap " + fmt(h.mean_top5_overlap, 2) + " (" + h.changed_queries + " changed)";
    }).join("; ") + "." : "";
  }

  // ------------------------------------------------------------ start
  showRoute(parseRoute(window.location.hash) || { view: "search" }, false);
})();
