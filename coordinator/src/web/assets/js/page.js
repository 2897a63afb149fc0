// What every page shares: listeners and timers that end with it.

export class Page {
  constructor() {
    this.disposed = false;
    this.cleanups = [];
  }

  listen(target, type, fn) {
    target.addEventListener(type, fn);
    this.cleanups.push(() => target.removeEventListener(type, fn));
  }

  dispose() {
    this.disposed = true;
    for (const cleanup of this.cleanups.splice(0)) cleanup();
  }
}
